// models/train: the progress bar's text, flag parsing, checkpoints, and the training loop's resume:
// N steps, save, load, N steps equals 2N steps bit for bit.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <utility>

#include "models/train/checkpoint.h"
#include "models/train/flags.h"
#include "models/train/plot.h"
#include "models/train/progress.h"
#include "models/train/trainer.h"
#include "support.h"

using namespace kiln;
using namespace kiln::test;
namespace fs = std::filesystem;

namespace {

std::string scratch_dir(const std::string& name) {
  fs::path p = fs::path(process_scratch_dir("kiln-test-train")) / name;
  fs::remove_all(p);
  return p.string();
}

void check_same_state(const TensorDict& a, const TensorDict& b) {
  REQUIRE(a.keys() == b.keys());
  for (const auto& [name, t] : a) {
    INFO(name);
    check_equal(t, b.at(name));
  }
}

train::TrainOptions small_run(const std::string& model, const std::string& out) {
  train::TrainOptions o;
  o.model = model;
  o.dataset = "synthetic";
  o.limit_train = model == "resnet" ? 96 : 320;
  o.limit_test = 64;
  o.batch_size = 32;
  o.epochs = 2;
  o.seed = 7;
  o.num_workers = 0;
  o.out_dir = out;
  o.quiet = true;
  o.plot = false;
  return o;
}

}  // namespace

TEST_CASE("ProgressBar renders tqdm's bar on a terminal and plain lines elsewhere") {
  CHECK(train::ProgressBar::render("epoch 1/3", 174, 469, 21.0, 0.43211, true, 20) ==
        "epoch 1/3  37%|███████▍            | 174/469 [00:21<00:36, 8.29 it/s, loss=0.4321]");
  CHECK(train::ProgressBar::render("epoch 1/3", 469, 469, 60.0, 0.25, true, 10) ==
        "epoch 1/3 100%|██████████| 469/469 [01:00<00:00, 7.82 it/s, loss=0.2500]");
  CHECK(train::ProgressBar::render("epoch 2/3", 50, 200, 10.0, 1.5, false) ==
        "epoch 2/3 step 50/200 (25%) loss 1.5000 5.00 it/s elapsed 00:10 eta 00:30");
  CHECK(train::format_duration(3725) == "1:02:05");
}

TEST_CASE("Flags parse values, switches and defaults, and name what is wrong") {
  train::Flags f("prog", "does things");
  f.add("epochs", "1", "passes");
  f.add("lr", "", "learning rate");
  f.add("model", "cnn", "which model");
  f.add_switch("quiet", "say less");
  const char* argv[] = {"prog", "--epochs", "3", "--lr=0.5", "--quiet"};
  f.parse(5, argv);
  CHECK(f.get_int("epochs", 1) == 3);
  CHECK(f.get_double("lr") == 0.5);
  CHECK(f.get_switch("quiet"));
  CHECK_FALSE(f.given("model"));
  CHECK(f.get_choice("model", {"mlp", "cnn"}) == "cnn");
  CHECK(f.help().find("--epochs VALUE") != std::string::npos);

  train::Flags g("prog", "does things");
  g.add("epochs", "1", "passes");
  g.add("model", "cnn", "which model");
  const char* unknown[] = {"prog", "--epoch", "3"};
  check_error([&] { g.parse(3, unknown); }, {"unknown flag --epoch", "--help"});
  const char* missing[] = {"prog", "--epochs"};
  check_error([&] { g.parse(2, missing); }, {"--epochs needs a value"});
  const char* bad[] = {"prog", "--epochs", "two", "--model", "vgg"};
  g.parse(5, bad);
  check_error([&] { (void)g.get_int("epochs", 1); }, {"--epochs must be an integer, not 'two'"});
  check_error([&] { (void)g.get_choice("model", {"mlp", "cnn"}); }, {"--model must be one of mlp, cnn, not 'vgg'"});

  train::Flags h("prog", "does things");
  h.add("threads", "0", "threads");
  h.add("lr", "", "learning rate");
  for (const char* value : {"inf", "nan", "-inf"}) {
    const char* argv_lr[] = {"prog", "--lr", value, "--threads", "4294967297"};
    h.parse(5, argv_lr);
    check_error([&] { (void)h.get_double("lr"); }, {"--lr must be a finite number", value});
  }
  CHECK(h.get_int("threads", 0) == 4294967297);
  const char* tiny[] = {"prog", "--lr", "1e-320"};
  h.parse(3, tiny);
  CHECK(h.get_double("lr") == 1e-320);  // an underflow to a denormal is still that number
  const char* huge[] = {"prog", "--lr", "1e999"};
  h.parse(3, huge);
  check_error([&] { (void)h.get_double("lr"); }, {"--lr must be a finite number, not '1e999'"});
  check_error([&] { (void)h.get_int("threads", 0, 2147483647); }, {"--threads must be at most 2147483647", "4294967297"});
}

TEST_CASE("write_file_atomic replaces a file whole and leaves it untouched on failure") {
  const std::string dir = scratch_dir("atomic");
  fs::create_directories(dir);
  const std::string path = dir + "/a.json";
  train::write_file_atomic(path, "first");
  train::write_file_atomic(path, "second");
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  CHECK(text == "second");
  // A parent that is a regular file: the write fails (even as root) and nothing is left behind.
  check_error([&] { train::write_file_atomic(path + "/x.json", "y"); }, {"cannot write", "a.json/x.json"});
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);
}

TEST_CASE("load_checkpoint names what is missing or damaged") {
  const std::string dir = scratch_dir("bad-ckpt");
  check_error([&] { train::load_checkpoint(dir); }, {"no checkpoint in", "checkpoint.json is missing"});
  fs::create_directories(dir);
  train::write_file_atomic(dir + "/checkpoint.json", "{\"format\": ");
  check_error([&] { train::load_checkpoint(dir); }, {"checkpoint.json is not valid JSON"});
  train::write_file_atomic(dir + "/checkpoint.json", "{\"format\": \"other\"}");
  check_error([&] { train::load_checkpoint(dir); }, {"is not a Kiln checkpoint manifest"});
  train::write_file_atomic(dir + "/checkpoint.json", "{\"format\": 7}");
  check_error([&] { train::load_checkpoint(dir); }, {"is not a Kiln checkpoint manifest"});
  train::write_file_atomic(dir + "/checkpoint.json", "{\"format\": \"kiln-checkpoint\", \"version\": \"1\"}");
  check_error([&] { train::load_checkpoint(dir); }, {"checkpoint version \"1\" is not supported"});
  train::write_file_atomic(dir + "/checkpoint.json", "{\"format\": \"kiln-checkpoint\", \"version\": 1}");
  check_error([&] { train::load_checkpoint(dir); }, {"a field is missing", "damaged"});
  // A negative count, which a hand-edited or damaged manifest could hold.
  train::Checkpoint c;
  c.model = TensorDict{{"w", ones({2})}};
  c.step = 3;
  train::save_checkpoint(dir, c);
  std::ifstream in(dir + "/checkpoint.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string field = "\"step\": 3";
  const size_t at = text.find(field);
  REQUIRE(at != std::string::npos);
  const std::string good = text;
  train::write_file_atomic(dir + "/checkpoint.json", text.replace(at, field.size(), "\"step\": -3"));
  check_error([&] { train::load_checkpoint(dir); }, {"step -3", "must all be in [0, 2^53)", "damaged"});
  // A step whose next one would overflow, and a file named by a path out of the checkpoint.
  text = good;
  train::write_file_atomic(dir + "/checkpoint.json", text.replace(at, field.size(), "\"step\": 9223372036854775807"));
  check_error([&] { train::load_checkpoint(dir); }, {"step 9223372036854775807", "[0, 2^53)", "damaged"});
  text = good;
  const std::string model_file = "\"model.safetensors\"";
  const size_t m = text.find(model_file);
  REQUIRE(m != std::string::npos);
  train::write_file_atomic(dir + "/checkpoint.json", text.replace(m, model_file.size(), "\"/etc/passwd\""));
  check_error([&] { train::load_checkpoint(dir); }, {"files.model is '/etc/passwd'", "plain name", "damaged"});
  // A FIFO in the manifest's place is an Error, not a wait for a writer.
  fs::remove(dir + "/checkpoint.json");
  REQUIRE(::mkfifo((dir + "/checkpoint.json").c_str(), 0600) == 0);
  check_error([&] { train::load_checkpoint(dir); }, {"no checkpoint in", "checkpoint.json is missing"});
}

// The files of one save: its step, read back through the manifest and the model file.
static void check_saved_step(const std::string& dir, int64_t step) {
  const train::Checkpoint back = train::load_checkpoint(dir);
  CHECK(back.step == step);
  check_equal(back.model.at("w"), full({2}, static_cast<double>(step)));
}

TEST_CASE("save_checkpoint replaces a checkpoint whole, a save cut short leaves the previous one") {
  const std::string root = scratch_dir("whole");
  const std::string dir = root + "/checkpoint";
  auto at_step = [](int64_t step) {
    train::Checkpoint c;
    c.model = TensorDict{{"w", full({2}, static_cast<double>(step))}};
    c.step = step;
    return c;
  };
  train::save_checkpoint(dir + "/", at_step(1));  // a trailing separator names the same directory
  check_saved_step(dir, 1);
  // A save killed part-way left its staging directory: the next save removes it.
  fs::create_directories(root + "/.checkpoint.saving-99999");
  std::ofstream(root + "/.checkpoint.saving-99999/model.safetensors") << "half";
  train::save_checkpoint(dir, at_step(2));
  check_saved_step(dir, 2);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root)) names.push_back(e.path().filename().string());
  CHECK(names == std::vector<std::string>{"checkpoint"});
  // A staging directory of a process that is alive (pid 1) is that process's save in progress: kept.
  fs::create_directories(root + "/.checkpoint.saving-1");
  train::save_checkpoint(dir, at_step(2));
  CHECK(fs::exists(root + "/.checkpoint.saving-1"));
  fs::remove_all(root + "/.checkpoint.saving-1");
  // A save that fails while writing (here its configuration is not JSON) leaves the previous
  // checkpoint whole and no staging directory.
  train::Checkpoint broken = at_step(3);
  broken.config = "{not json";
  CHECK_THROWS(train::save_checkpoint(dir, broken));
  check_saved_step(dir, 2);
  CHECK(std::distance(fs::directory_iterator(root), fs::directory_iterator()) == 1);
  // Cut short between the two renames of a file system without RENAME_EXCHANGE: the directory is
  // gone and "<name>.previous" holds the previous checkpoint, which the Error names.
  fs::rename(dir, dir + ".previous");
  check_error([&] { train::load_checkpoint(dir); }, {"checkpoint.previous holds one", "resume from"});
  check_saved_step(dir + ".previous", 2);
  // A file in the directory's place is an Error before anything is written.
  std::ofstream(dir) << "x";
  check_error([&] { train::save_checkpoint(dir, at_step(4)); }, {"a file of that name is in the way"});
}

TEST_CASE("open_metrics drops, on resume, the lines after the checkpoint's step") {
  const std::string dir = scratch_dir("metrics");
  fs::create_directories(dir);
  const std::string path = dir + "/metrics.jsonl";
  {
    std::ofstream out(path);
    for (int s = 1; s <= 8; ++s) out << "{\"type\":\"step\",\"step\":" << s << "}\n";
    out << "{\"type\":\"eval\",\"step\":8,\"val_loss\":1.5}\n";
    out << "{\"type\":\"step\",\"st";  // cut short by a crash
  }
  std::FILE* f = train::open_metrics(path, /*resume=*/true, 5);
  REQUIRE(f != nullptr);
  std::fputs("{\"type\":\"step\",\"step\":6}\n", f);
  std::fclose(f);
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  REQUIRE(lines.size() == 6);
  CHECK(lines[4] == "{\"type\":\"step\",\"step\":5}");
  CHECK(lines[5] == "{\"type\":\"step\",\"step\":6}");
  // A fresh run starts the file afresh.
  f = train::open_metrics(path, /*resume=*/false, 0);
  std::fclose(f);
  CHECK(fs::file_size(path) == 0);
  check_error([&] { train::open_metrics(dir + "/no-such-dir/metrics.jsonl", false, 0); }, {"cannot write"});
}

TEST_CASE("A checkpoint keeps a GradScaler's state, one saved without it loads with none") {
  // A scaler part-way through DeepSpeed's rule: one overflow absorbed by the hysteresis, then a
  // second that halves the scale, then a good step.
  optim::GradScaler scaler;
  Tensor w = ones({2}).requires_grad_();
  optim::SGD opt({w}, {.lr = 0.1});
  for (double g : {std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(), 1.0}) {
    opt.zero_grad();
    scaler.scale((w * g).sum()).backward();
    scaler.step(opt);
    scaler.update();
  }
  REQUIRE(scaler.get_scale() == 32768);
  REQUIRE(scaler.skipped_steps() == 2);

  const std::string dir = scratch_dir("scaler-ckpt");
  train::Checkpoint c;
  c.model = TensorDict{{"w", w.detach()}};
  c.optimizer = opt.state_dict();
  c.scaler = scaler.state_dict();
  train::save_checkpoint(dir, c);
  CHECK(fs::exists(dir + "/scaler.safetensors"));
  train::Checkpoint back = train::load_checkpoint(dir);
  REQUIRE(back.scaler.size() == c.scaler.size());  // (the file keeps the keys sorted)
  for (const auto& [name, t] : c.scaler) {
    INFO(name);
    check_equal(back.scaler.at(name), t);
  }
  optim::GradScaler resumed;
  resumed.load_state_dict(back.scaler);
  CHECK(resumed.get_scale() == 32768);
  CHECK(resumed.skipped_steps() == 2);
  CHECK(resumed.cur_hysteresis() == 1);

  // Without a scaler (kiln-train's checkpoints, and train_gpt's before it saved one): no file, and
  // the loaded field is empty, so a resumed fp16 run starts a fresh scaler.
  const std::string plain = scratch_dir("plain-ckpt");
  c.scaler = {};
  train::save_checkpoint(plain, c);
  CHECK_FALSE(fs::exists(plain + "/scaler.safetensors"));
  CHECK(train::load_checkpoint(plain).scaler.empty());
}

TEST_CASE("Training resumed from a checkpoint equals training straight through, bit for bit") {
  // (model, steps before the stop): mid-epoch, at an epoch's end, with BatchNorm buffers.
  const std::vector<std::pair<std::string, int64_t>> cases = {{"mlp", 4}, {"mlp", 10}, {"cnn", 13}, {"resnet", 2}};
  for (const auto& [model, stop] : cases) {
    DYNAMIC_SECTION(model << " stopped after " << stop << " steps") {
      train::TrainOptions straight = small_run(model, scratch_dir(model + "-straight"));
      if (model == "cnn") straight.scheduler = "onecycle";
      if (model == "mlp" && stop == 10) straight.scheduler = "plateau";  // stopped after its first step
      train::TrainResult a = train::train(straight);

      train::TrainOptions first = straight;
      first.out_dir = scratch_dir(model + "-first");
      first.max_steps = stop;
      train::TrainResult b1 = train::train(first);
      REQUIRE(b1.steps == stop);

      train::TrainOptions second;
      second.resume = b1.checkpoint_dir;
      second.epochs = straight.epochs;
      second.num_workers = 2;  // the order does not depend on the worker count
      second.out_dir = scratch_dir(model + "-second");
      second.quiet = true;
      second.plot = false;
      train::TrainResult b2 = train::train(second);

      CHECK(b2.steps == a.steps);
      CHECK(b2.last_loss == a.last_loss);
      CHECK(b2.test_accuracy == a.test_accuracy);
      train::Checkpoint ca = train::load_checkpoint(a.checkpoint_dir);
      train::Checkpoint cb = train::load_checkpoint(b2.checkpoint_dir);
      check_same_state(ca.model, cb.model);
      check_same_state(ca.optimizer, cb.optimizer);
      check_same_state(ca.scheduler, cb.scheduler);
      CHECK(ca.step == cb.step);
      CHECK(ca.epoch == cb.epoch);
    }
  }
}

TEST_CASE("The training loop learns the synthetic set and writes metrics and a checkpoint") {
  train::TrainOptions o = small_run("mlp", scratch_dir("learn"));
  o.limit_train = 2000;
  o.limit_test = 500;
  o.epochs = 2;
  train::TrainResult r = train::train(o);
  CHECK(r.steps == 2 * 63);
  CHECK(r.test_accuracy > 0.9);  // ten distinct patterns under noise: chance is 0.1
  std::ifstream metrics(o.out_dir + "/metrics.jsonl");
  int epochs = 0;
  for (std::string line; std::getline(metrics, line);) epochs += line.find("\"type\":\"epoch\"") != std::string::npos;
  CHECK(epochs == 2);
  train::Checkpoint c = train::load_checkpoint(r.checkpoint_dir);
  CHECK(c.epoch == 2);
  CHECK(c.step == r.steps);
  CHECK(c.model.contains("fc1.weight"));
}

TEST_CASE("A resumed run keeps its number of epochs, one with nothing left to train is an Error") {
  train::TrainOptions o = small_run("mlp", scratch_dir("epochs"));
  o.limit_train = 320;
  o.limit_test = 64;
  o.epochs = 3;
  o.batch_size = 64;  // 5 steps an epoch
  o.max_steps = 12;   // stops in the third
  const train::TrainResult first = train::train(o);
  REQUIRE(first.steps == 12);
  train::TrainOptions resumed;
  resumed.resume = first.checkpoint_dir;
  resumed.epochs = 0;  // kiln-train without --epochs: the run's own 3
  resumed.out_dir = scratch_dir("epochs-resumed");
  resumed.quiet = true;
  resumed.plot = false;
  const train::TrainResult rest = train::train(resumed);
  CHECK(rest.steps == 15);
  CHECK(rest.epochs == 3);
  CHECK(train::load_checkpoint(rest.checkpoint_dir).epoch == 3);
  resumed.resume = rest.checkpoint_dir;
  resumed.out_dir = scratch_dir("epochs-again");
  check_error([&] { train::train(resumed); }, {"at epoch 3, step 15, and the run asks for 3 epochs in all", "--epochs"});
  // A setting given again must agree with the checkpoint's (kiln-train's --lr 0.5 here); an equal
  // one is fine.
  resumed.epochs = 4;
  resumed.lr = 0.5;
  resumed.batch_size = 64;
  resumed.given = {"lr", "batch-size"};
  check_error([&] { train::train(resumed); }, {"--lr asks for lr = 0.5 but the checkpoint", "has lr = null"});
  resumed.given = {"batch-size"};
  CHECK(train::train(resumed).steps == 20);
}

TEST_CASE("A run's output directory is locked, metrics that cannot be written are an Error") {
  const std::string dir = scratch_dir("locked");
  fs::create_directories(dir);
  {
    train::OutDirLock held(dir);
    check_error([&] { train::OutDirLock second(dir); }, {"another run is writing to", dir, "choose another --out"});
    train::TrainOptions o = small_run("mlp", dir);
    check_error([&] { train::train(o); }, {"another run is writing to"});
  }
  train::OutDirLock again(dir);  // the first one's end released it
  std::FILE* full = std::fopen("/dev/full", "w");
  REQUIRE(full != nullptr);
  check_error([&] { train::write_metrics_line(full, "/dev/full", std::string(100, 'x')); },
              {"cannot write /dev/full", "No space left"});
  std::fclose(full);
  train::write_metrics_line(nullptr, "unused", "x");  // a rank other than 0 writes nothing
}

TEST_CASE("device_flag: a CUDA device without a GPU is an Error in the programs' words") {
  CHECK(train::device_flag("cpu") == Device::cpu());
  if (cuda::is_available()) {
    CHECK(train::device_flag("cuda").is_cuda());
  } else {
    check_error([] { train::device_flag("cuda:0"); }, {"--device cuda:0", "no usable CUDA GPU", "use --device cpu"});
  }
  check_error([] { train::device_flag("tpu"); }, {"tpu"});
}

TEST_CASE("Bad training options are Errors that name the option") {
  train::TrainOptions o = small_run("mlp", scratch_dir("bad"));
  o.model = "vgg";
  check_error([&] { train::train(o); }, {"--model must be one of mlp, cnn, resnet, not 'vgg'"});
  o = small_run("mlp", scratch_dir("bad"));
  o.dataset = "fashion-mnist";
  o.data_root = "/nonexistent/fmnist";
  check_error([&] { train::train(o); }, {"/nonexistent/fmnist", "dataset-fashion-mnist"});
  o = small_run("mlp", scratch_dir("bad"));
  o.out_dir = "/proc/version/out";  // under a regular file: not creatable, even as root
  check_error([&] { train::train(o); }, {"cannot use --out /proc/version/out"});
}

TEST_CASE("A synthetic set too big for this machine is an Error before its tables are built") {
  train::TrainOptions o = small_run("mlp", scratch_dir("huge"));
  o.limit_train = int64_t{1} << 50;  // 16 PiB of index tables
  check_error([&] { train::train(o); },
              {"1125899906842624 synthetic training and 64 test samples' index tables need about", "more than this "
               "machine's", "choose a smaller --limit-train or --limit-test"});
  o.limit_train = std::numeric_limits<int64_t>::max();  // the sizes do not overflow on the way
  check_error([&] { train::train(o); }, {"index tables need about", "--limit-train"});
  CHECK_FALSE(fs::exists(o.out_dir));
}

TEST_CASE("exit_on_exception: the exit code by kind of exception, and the memory hint when out of memory") {
  auto end = [](auto thrower) {
    int code = -1;
    std::string text = kiln::test::captured_output(2, [&] {
      try {
        thrower();
      } catch (...) {
        code = train::exit_on_exception("prog", "Lower --batch-size");
      }
    });
    return std::pair{code, text};
  };
  using Ended = std::pair<int, std::string>;
  CHECK(end([] { throw OutOfMemoryError("out of CPU memory: could not allocate 8 bytes (0.0 MiB)"); }) ==
        Ended{2, "prog: error: out of CPU memory: could not allocate 8 bytes (0.0 MiB). Lower --batch-size\n"});
  CHECK(end([] { throw std::bad_alloc(); }) ==
        Ended{2, "prog: error: out of CPU memory (std::bad_alloc). Lower --batch-size\n"});
  CHECK(end([] { throw Error("--epochs must be 1 or more"); }) == Ended{2, "prog: error: --epochs must be 1 or more\n"});
  CHECK(end([] { throw std::runtime_error("disk on fire"); }) == Ended{1, "prog: error: disk on fire\n"});
  CHECK(end([] { throw 42; }) == Ended{1, "prog: error: an exception that is not a std::exception\n"});
  // A launcher variable that does not parse (RANK=abc) is itself often the error being reported: the
  // handler asked the world's size again, which threw out of it and aborted (exit 134).
  ::setenv("RANK", "abc", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  const Ended bad_env = end([] { throw Error("--bogus is not a flag"); });
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  CHECK(bad_env == Ended{2, "prog: error: --bogus is not a flag\n"});
}

TEST_CASE("the training plot runs gnuplot without a shell: no quote or semicolon in --out is a command") {
  // kiln-train --out "runs/q';touch /tmp/PWNED;'" ran `touch` through std::system.
  const fs::path dir = fs::path(scratch_dir("plot")) / "q';touch kiln_pwned;'";
  fs::create_directories(dir);
  const fs::path marker = fs::current_path() / "kiln_pwned";
  fs::remove(marker);
  train::History h;
  h.step = {1, 2, 3};
  h.loss = {2.0, 1.5};  // a damaged history: one loss short; plotted up to the shorter column
  h.epoch = {1};
  h.test_loss = {1.4};
  h.test_accuracy = {0.5};
  std::string why;
  const std::string png = train::plot_history(h, dir.string(), &why);
  CHECK_FALSE(fs::exists(marker));
  if (std::system("command -v gnuplot > /dev/null 2>&1") == 0) {  // the image itself where gnuplot is
    INFO(why);
    CHECK(png == (dir / "training.png").string());
    CHECK(fs::file_size(png) > 0);
  }
  std::ifstream tsv(dir / "history.tsv");
  const std::string text((std::istreambuf_iterator<char>(tsv)), std::istreambuf_iterator<char>());
  CHECK(text.find("2\t1.5\n") != std::string::npos);
  CHECK(text.find("3\t") == std::string::npos);
}

TEST_CASE("read_flag_file: a device, a FIFO or a directory is an Error, not a hang") {
  kiln::test::check_error([] { train::read_flag_file("/dev/zero", "deepspeed-config"); },
                          {"--deepspeed-config", "'/dev/zero' is not a regular file"});
  kiln::test::check_error([] { train::read_flag_file("/nonexistent/ds.json", "deepspeed-config"); },
                          {"--deepspeed-config", "cannot open '/nonexistent/ds.json'"});
  kiln::test::check_error([] { train::read_flag_file("/tmp", "deepspeed-config"); }, {"not a regular file"});
}

TEST_CASE("The plateau scheduler of kiln-train halves the lr after an epoch whose test loss is not below the best") {
  train::TrainOptions o = small_run("mlp", scratch_dir("plateau"));
  o.scheduler = "plateau";
  o.optimizer = "sgd";
  o.lr = 0.2;  // large enough that the test loss stops falling within a few epochs
  o.epochs = 6;
  o.batch_size = 64;  // 5 steps an epoch
  o.log_every = 1;
  train::train(o);
  // The lr of each step line against a ReduceLROnPlateau fed the epochs' test losses.
  Tensor p = zeros({1}).requires_grad_();
  optim::SGD reference({p}, {.lr = 0.2});
  optim::ReduceLROnPlateau plateau(reference, {.factor = 0.5, .patience = 0});
  std::ifstream metrics(o.out_dir + "/metrics.jsonl");
  int64_t steps = 0, epochs = 0;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.at("type") == "step") {
      INFO("step " << j.at("step"));
      CHECK(j.at("lr").get<double>() == reference.param_groups()[0].lr());
      ++steps;
    } else if (j.at("type") == "epoch") {
      plateau.step(j.at("test_loss").get<double>());
      ++epochs;
    }
  }
  CHECK(steps == 30);
  CHECK(epochs == 6);
  CHECK(reference.param_groups()[0].lr() < 0.2);  // the run saw at least one plateau
  train::Checkpoint c = train::load_checkpoint(o.out_dir + "/checkpoint");
  CHECK(c.scheduler.at("best").item<double>() == plateau.best());
  CHECK(c.scheduler.at("last_epoch").item<int64_t>() == 6);
}
