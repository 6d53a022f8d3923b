// models/kiln_train.cpp: kiln-train, Kiln's main job: trains an image classifier (mlp, cnn, resnet)
// on Fashion-MNIST (or a synthetic stand-in), with a progress bar, a test accuracy after each epoch,
// metrics as JSON lines, a plot and a checkpoint to resume from. `kiln-train --help` lists the flags.
//
//   kiln-train --model cnn --epochs 1 --out runs/cnn
//   kiln-train --resume runs/cnn/checkpoint --epochs 2 --out runs/cnn
//   kiln-run -n 2 kiln-train --model cnn --out runs/cnn-ddp   # data parallel on 2 ranks
//   kiln-run -n 2 kiln-train --deepspeed-config configs/ds_zero3_bf16.json --out runs/cnn-zero3
#include <climits>
#include <cstdio>

#include <kiln/kiln.h>

#include "models/train/flags.h"
#include "models/train/trainer.h"

using namespace kiln;

int main(int argc, char** argv) {
  train::Flags flags("kiln-train", "Trains an image classifier on Fashion-MNIST with Kiln.");
  flags.add("model", "cnn", "mlp, cnn (LeNet-style) or resnet (a small ResNet)");
  flags.add("dataset", "fashion-mnist", "fashion-mnist (Debian's dataset-fashion-mnist) or synthetic");
  flags.add("data-root", "/usr/share/datasets/fashion-mnist", "where the Fashion-MNIST .gz files are");
  flags.add("epochs", "1", "passes over the training set");
  flags.add("batch-size", "128", "samples per step (per rank when data parallel under kiln-run)");
  flags.add("optimizer", "adam", "sgd, adam, adamw, rmsprop or adagrad");
  flags.add("lr", "", "learning rate (default: 0.05 for sgd, 0.01 for rmsprop and adagrad, 0.001 otherwise)");
  flags.add("momentum", "", "momentum of sgd (default 0.9) and rmsprop (default 0)");
  flags.add("weight-decay", "", "weight decay (default: 0.01 for adamw, 0 otherwise)");
  flags.add("scheduler", "none", "learning-rate schedule, stepped each batch: none, step (halve each "
            "epoch), cosine, onecycle or warmup-cosine; or plateau, stepped each epoch (halve when the "
            "test loss is not 0.01% below its best)");
  flags.add("seed", "0", "seed of the initialisation and the data order");
  flags.add("device", "cpu", "cpu, cuda or cuda:N");
  flags.add("threads", "0", "CPU threads (0: every core, shared out among the ranks of a machine)");
  flags.add("workers", "1", "data-loader threads preparing batches ahead");
  flags.add("limit-train", "0", "use only the first N training samples (0: all)");
  flags.add("limit-test", "0", "use only the first N test samples (0: all)");
  flags.add("max-steps", "0", "stop after N steps in all and save a checkpoint (0: no limit)");
  flags.add("deepspeed-config", "", "a DeepSpeed ds_config.json: the engine then trains, with the config's "
            "micro-batch and accumulation, optimizer, schedule, fp16/bf16, clipping and ZeRO stage (so "
            "--batch-size, --optimizer, --lr, --momentum, --weight-decay and --scheduler are not given)");
  flags.add("out", "runs/kiln-train", "output directory: metrics.jsonl, training.png, checkpoint/");
  flags.add("resume", "", "continue from this checkpoint directory (model, data and optimizer "
            "settings come from it, and the number of epochs unless --epochs is given)");
  flags.add_switch("quiet", "no progress output");
  try {
    flags.parse(argc, argv);
    if (flags.help_requested()) {
      std::fputs(flags.help().c_str(), stdout);
      return 0;
    }
    train::TrainOptions o;
    o.model = flags.get_choice("model", train::Choices::model);
    o.dataset = flags.get_choice("dataset", train::Choices::dataset);
    o.data_root = flags.get("data-root");
    // Resumed without --epochs: the run's own number of epochs, from the checkpoint.
    o.epochs = flags.get("resume").empty() || flags.given("epochs") ? flags.get_int("epochs", 1) : 0;
    o.batch_size = flags.get_int("batch-size", 1);
    o.optimizer = flags.get_choice("optimizer", train::Choices::optimizer);
    if (flags.given("lr")) o.lr = flags.get_double("lr");
    if (flags.given("momentum")) o.momentum = flags.get_double("momentum");
    if (flags.given("weight-decay")) o.weight_decay = flags.get_double("weight-decay");
    o.scheduler = flags.get_choice("scheduler", train::Choices::scheduler);
    o.seed = static_cast<uint64_t>(flags.get_int("seed", 0));
    o.device = flags.get("device");
    o.threads = static_cast<int>(flags.get_int("threads", 0, INT_MAX));
    o.num_workers = static_cast<int>(flags.get_int("workers", 0, INT_MAX));
    o.limit_train = flags.get_int("limit-train", 0);
    o.limit_test = flags.get_int("limit-test", 0);
    o.max_steps = flags.get_int("max-steps", 0);
    if (const std::string& path = flags.get("deepspeed-config"); !path.empty()) {
      o.deepspeed_config = train::read_flag_file(path, "deepspeed-config");
      Config::from_string(o.deepspeed_config, path);  // its mistakes now, named with the file's path
    }
    o.out_dir = flags.get("out");
    o.resume = flags.get("resume");
    o.quiet = flags.get_switch("quiet");
    for (const char* setting : {"model", "dataset", "data-root", "batch-size", "optimizer", "lr", "momentum",
                                "weight-decay", "scheduler", "seed", "limit-train", "limit-test", "deepspeed-config"}) {
      if (flags.given(setting)) o.given.push_back(setting);
    }
    train::train(o);
    return 0;
  } catch (...) {
    return train::exit_on_exception("kiln-train", "The run does not fit in this machine's memory: lower "
                                    "--batch-size, --limit-train or --limit-test, or --workers (each prepares "
                                    "a batch ahead)");
  }
}
