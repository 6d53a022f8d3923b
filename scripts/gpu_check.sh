#!/usr/bin/env bash
# gpu_check.sh: the whole GPU check in one command, for a GPU machine that has CUDA, CMake and Ninja
# but no package access. Before copying the tree there, unpack the Debian build dependencies into
# ./.deps in Debian's layout (the README's "Tests" section says how). The script configures against
# them, builds with every core, runs the GPU tests, then the whole suite, then the GPU benchmarks,
# and leaves in $OUT (default ./gpu-out) the JSON lines of the benchmarks (bench.jsonl, gpt.jsonl,
# dist.jsonl), device.txt and logs.tar.gz, the logs of every step (kept in build/gpu/logs and packed
# after each step, so that a run cut short still returns the steps before it in few files).
#   usage: scripts/gpu_check.sh [build|test|sanitize|train|bench|gpt|dist] ...   (default: build test bench)
# sanitize: the GPU tests but the op table's and NCCL's under compute-sanitizer's memcheck, with the
# allocator's cache off so that each tensor's bounds are checked. train: kiln-train on the GPU.
# gpt: GPT-2 124M and gpt_char against PyTorch, and the fused kernels against their compositions.
# dist: bench_collectives on NCCL (one rank: one GPU) and on MPI with CUDA tensors staged through
# pinned host memory (two ranks sharing the GPU).
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
deps=$PWD/.deps/usr
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu:$deps/lib/x86_64-linux-gnu/openmpi/lib:${LD_LIBRARY_PATH:-}
export OPAL_PREFIX=$deps PATH=$deps/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
build=build/gpu
logs=$build/logs
mkdir -p "$logs"
pack_logs() { tar czf "$out/logs.tar.gz" -C "$logs" . 2>/dev/null; }
trap pack_logs EXIT
steps=("$@")
((${#steps[@]})) || steps=(build test bench)
status=0
for step in "${steps[@]}"; do
  case $step in
  build)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
    nvcc --version | tail -2 >>"$out/device.txt"
    start=$SECONDS
    # cuDNN: the toolkit's, else the one in Python's nvidia-cudnn wheel (PyTorch's), if any.
    cudnn_root=${CUDNN_ROOT:-}
    if [[ -z $cudnn_root && ! -f /usr/local/cuda/include/cudnn.h ]]; then
      cudnn_root=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null)
    fi
    cmake -S . -B $build -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$deps" \
      -DKILN_WITH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 ${cudnn_root:+-DCUDNN_ROOT="$cudnn_root"} \
      >"$logs/configure.log" 2>&1 ||
      { tail -40 "$logs/configure.log"; exit 1; }
    grep -i "mpi\|nccl\|cudnn" "$logs/configure.log" | head -10
    cmake --build $build -j"$(nproc)" >"$logs/build.log" 2>&1 ||
      { grep -B2 -A12 "error" "$logs/build.log" | head -120; exit 1; }
    echo "gpu_check: built in $((SECONDS - start)) s"
    ;;
  test)
    start=$SECONDS
    timeout 300 $build/bin/test_cuda --durations yes 2>&1 | head -c 15000000 >"$logs/test_cuda.log"
    rc=${PIPESTATUS[0]}; echo "gpu_check: test_cuda exit $rc"; ((rc)) && status=1
    grep -E "^test cases|^assertions|seconds: " "$logs/test_cuda.log" | sort -t: -k1,1 | tail -40
    timeout 400 ctest --test-dir $build -j"$(nproc)" -E "^cuda: all" --output-on-failure --timeout 300 >"$logs/ctest.log" 2>&1
    rc=$?; echo "gpu_check: ctest exit $rc"; ((rc)) && status=1
    grep -E "tests passed|Failed|\*\*\*|Not Run" "$logs/ctest.log" | head -40
    ;;
  sanitize)
    KILN_CUDA_NO_CACHING=1 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
      $build/bin/test_cuda "~[op_table]~[nccl]" 2>&1 | tail -c 2000000 >"$logs/sanitize.log"
    rc=${PIPESTATUS[0]}; echo "gpu_check: compute-sanitizer memcheck exit $rc"; ((rc)) && status=1
    grep -E "ERROR SUMMARY|^test cases|^assertions|Invalid" "$logs/sanitize.log" | head -20
    ;;
  train)
    data=$deps/share/datasets/fashion-mnist
    [[ -d $data ]] || data=$deps/share/datasets/fmnist-10k
    for model in cnn resnet; do
      timeout 200 $build/bin/kiln-train --model $model --device cuda --data-root "$data" --epochs 2 \
        --out "$out/train-$model" --quiet 2>&1 | tail -3
      echo "gpu_check: kiln-train $model on the GPU exit ${PIPESTATUS[0]}"
    done
    rm -rf "$out"/train-*/checkpoint "$out"/train-*/*.png  # what comes back is limited
    ;;
  bench)
    # Kiln and PyTorch alternately, twice each, on the same GPU.
    for round in 1 2; do
      timeout 150 $build/bin/bench_cuda_ops | tee -a "$out/bench.jsonl"
      timeout 150 python3 benchmarks/anchors/torch_cuda_ops.py | tee -a "$out/bench.jsonl"
    done
    # The CNN on Fashion-MNIST: the full set when it is there, else a folder that holds the 10k test
    # images as the training set too (bundle it as .deps/usr/share/datasets/fmnist-10k).
    data=$deps/share/datasets/fashion-mnist
    [[ -d $data ]] || data=$deps/share/datasets/fmnist-10k
    if [[ -d $data ]]; then
      for round in 1 2; do
        timeout 150 $build/bin/bench_cnn_fmnist --epochs 3 --data "$data" --device cuda | tee -a "$out/bench.jsonl"
        timeout 150 python3 benchmarks/anchors/torch_cnn_fmnist.py --epochs 3 --data "$data" --device cuda |
          tee -a "$out/bench.jsonl"
      done
    fi
    ;;
  gpt)
    # BENCHMARKS.md's gpt2_124m (Kiln against PyTorch eager with SDPA, alternately, then PyTorch with
    # torch.compile once), gpt_char on the GPU against the PyTorch anchor, and the fusion benchmark.
    for round in 1 2; do
      timeout 200 $build/bin/bench_gpt2 | tee -a "$out/gpt.jsonl"
      timeout 200 python3 benchmarks/anchors/torch_gpt2.py | tee -a "$out/gpt.jsonl"
    done
    timeout 300 python3 benchmarks/anchors/torch_gpt2.py --compile 2>&1 | tail -1 | tee -a "$out/gpt.jsonl"
    # The switches' effects: float16 with loss scaling and float32 on both sides, fusion off on Kiln's.
    for precision in fp16 none; do
      timeout 200 $build/bin/bench_gpt2 --steps 15 --autocast $precision | tee -a "$out/gpt.jsonl"
      timeout 200 python3 benchmarks/anchors/torch_gpt2.py --steps 15 --autocast $precision | tee -a "$out/gpt.jsonl"
    done
    timeout 200 $build/bin/bench_gpt2 --steps 15 --no-fusion | tee -a "$out/gpt.jsonl"
    # Activation checkpointing and offload to pinned host memory: step time and peak device memory.
    for flag in --checkpoint --offload; do
      timeout 200 $build/bin/bench_gpt2 --steps 15 $flag | tee -a "$out/gpt.jsonl"
    done
    # Where a step's time goes: each part of one block, forward and backward, both sides.
    timeout 100 $build/bin/bench_gpt2 --breakdown | tee -a "$out/gpt.jsonl"
    # The register-tiled attention kernels (cuda/attention.cu, Note [register-tiled attention]),
    # still opt-in: their breakdown and a whole GPT-2 run.
    KILN_CUDA_ATTENTION=mma timeout 100 $build/bin/bench_gpt2 --breakdown | tee -a "$out/gpt.jsonl"
    KILN_CUDA_ATTENTION=mma timeout 200 $build/bin/bench_gpt2 | tee -a "$out/gpt.jsonl"
    timeout 100 python3 benchmarks/anchors/torch_gpt2.py --breakdown | tee -a "$out/gpt.jsonl"
    # The corpus: bundle it as .deps/corpus/fortunes.txt (scripts/make_fortunes_corpus.sh writes it).
    corpus=$PWD/.deps/corpus/fortunes.txt
    if [[ -f $corpus ]]; then
      for round in 1 2; do
        timeout 120 $build/bin/bench_gpt_char --device cuda --corpus "$corpus" | tee -a "$out/gpt.jsonl"
        timeout 120 python3 benchmarks/anchors/torch_gpt_char.py --device cuda --corpus "$corpus" |
          tee -a "$out/gpt.jsonl"
      done
    fi
    timeout 120 $build/bin/bench_fusion --device cuda | tee -a "$out/gpt.jsonl"
    ;;
  dist)
    # One rank: busbw is 0 and the ring/native summary means nothing; the times and algbw are the figures.
    timeout 200 $build/bin/kiln-run -n 1 $build/bin/bench_collectives $((256 << 20)) nccl 2>>"$logs/dist.log" |
      tee -a "$out/dist.jsonl"
    rc=${PIPESTATUS[0]}; echo "gpu_check: bench_collectives nccl exit $rc"; ((rc)) && status=1
    timeout 300 $build/bin/kiln-run -n 2 $build/bin/bench_collectives $((64 << 20)) mpi cuda 2>>"$logs/dist.log" |
      tee -a "$out/dist.jsonl"
    rc=${PIPESTATUS[0]}; echo "gpu_check: bench_collectives mpi cuda exit $rc"; ((rc)) && status=1
    tail -5 "$logs/dist.log"
    ;;
  esac
  pack_logs
done
exit $status
