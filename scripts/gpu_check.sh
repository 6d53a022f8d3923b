#!/usr/bin/env bash
# gpu_check.sh: the GPU check, for a GPU machine that has CUDA, CMake and Ninja but no package
# access. Before copying the tree there, run scripts/gpu_bundle.sh here: it puts the Debian build
# dependencies, Open MPI, the data and the corpus into ./.deps, which must travel with the tree.
# The script configures against them, builds with every core, and runs the steps named, in order;
# it leaves in $OUT (default ./gpu-out) the JSON lines of the benchmarks (bench.jsonl, gpt.jsonl,
# dist.jsonl), device.txt and logs.tar.gz, the logs of every step (kept in build/gpu/logs and
# packed after each step, so that a run cut short still returns the steps before it in few files).
#   usage: scripts/gpu_check.sh [build|test|suite|sanitize|nccl-memcheck|train|bench|gpt|profile|dist] ...
#          (default: build test bench)
# build: the GPU tests', benchmarks' and programs' targets only (everything when suite is named).
# test: test_cuda, then the other CTest entries labelled gpu (CUDA tensors through MPI, 2 and 3
# ranks on the one GPU). suite: the whole CTest suite. sanitize: the GPU tests but the op table's
# and NCCL's under compute-sanitizer's memcheck, with the allocator's cache off so that each
# tensor's bounds are checked. nccl-memcheck: the NCCL tests alone under memcheck, each error's
# lines shown (a 2026-12-04 run reported 4 errors there). train: kiln-train on the GPU. bench: bench_cuda_ops and the CNN
# against PyTorch. gpt: GPT-2 124M and gpt_char against PyTorch, the switches' effects, and the
# fused kernels against their compositions. profile: one GPT-2 step's GPU time per kernel, Kiln's
# (bench_gpt2 --kernels) and PyTorch's (torch_gpt2.py --kernels), into kernels.jsonl. dist: bench_collectives on NCCL (one rank: one GPU)
# and on MPI with CUDA tensors staged through pinned host memory (two ranks sharing the GPU).
#
# A lease of device time is short. GPU_CHECK_SECONDS=N makes the whole call end within about N
# seconds: each command's time limit is cut to what is left, and a command that would start with
# less than 30 s left is skipped, with a line saying so ("gpu_check: skipped ..."). Name the steps
# that matter most first. ROUNDS=N (default 2) sets how many times each Kiln/PyTorch pair alternates.
set -uo pipefail
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
deps=$PWD/.deps/usr
export LD_LIBRARY_PATH=$deps/lib/x86_64-linux-gnu:$deps/lib/x86_64-linux-gnu/openmpi/lib:${LD_LIBRARY_PATH:-}
export OPAL_PREFIX=$deps PATH=$deps/bin:$PATH
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
build=build/gpu
logs=$build/logs
rm -rf "$logs"  # a warm machine keeps build/ between calls: only this call's logs go back
mkdir -p "$logs"
exec 3>&2  # limit's notices go here, not into the output of the command it skips
rounds=${ROUNDS:-2}
deadline=${GPU_CHECK_SECONDS:-}
if [[ -n $deadline && ! $deadline =~ ^[0-9]+$ ]]; then
  echo "gpu_check: GPU_CHECK_SECONDS='$deadline' is not a number of seconds" >&2
  exit 2
fi
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check: ROUNDS='$rounds' must be a whole number >= 1" >&2; exit 2; }
pack_logs() { tar czf "$out/logs.tar.gz" -C "$logs" . 2>/dev/null; }
finish() {
  [[ -s $logs/skipped.txt ]] && { echo "gpu_check: skipped for time:"; sed 's/^/  /' "$logs/skipped.txt"; }
  pack_logs
}
trap finish EXIT
# limit SECONDS COMMAND...: runs COMMAND under timeout, cut to the time left before the deadline
# (less 10 s to pack the logs); with less than 30 s left it is skipped and noted (exit 124).
limit() {
  local t=$1
  shift
  if [[ -n $deadline ]]; then
    local left=$((deadline - SECONDS - 10))
    ((left < t)) && t=$left
    if ((t < 30)); then
      echo "gpu_check: skipped $(basename "$1") ${*:2}: ${left} s left" | tee -a "$logs/skipped.txt" >&3
      return 124
    fi
  fi
  timeout -k 15 "$t" "$@"  # SIGTERM first: Kiln's handler says what a rank was doing
}
steps=("$@")
((${#steps[@]})) || steps=(build test bench)
# What the steps other than suite run; the whole tree builds when suite is named.
targets=(test_cuda test_distributed kiln-run kiln-train bench_cuda_ops bench_cnn_fmnist bench_gpt2 bench_gpt_char
         bench_fusion bench_collectives)
[[ " ${steps[*]} " == *" suite "* ]] && targets=(all)
status=0
for step in "${steps[@]}"; do
  case $step in
  build)
    # What a results file names: the device, driver, CUDA, date and commit (KILN_COMMIT where the
    # tree came without .git: pass it in the command).
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/device.txt"
    nvcc --version | tail -2 >>"$out/device.txt"
    echo "date: $(date -u +%FT%TZ); commit: ${KILN_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" |
      tee -a "$out/device.txt"
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
    grep "^-- kiln:" "$logs/configure.log"
    # test_distributed exists only where CMake found MPI.
    if grep -q "^-- kiln: MPI not found" "$logs/configure.log"; then
      kept=()
      for t in "${targets[@]}"; do [[ $t == test_distributed ]] || kept+=("$t"); done
      targets=("${kept[@]}")
    fi
    limit 900 cmake --build $build -j"$(nproc)" --target "${targets[@]}" >"$logs/build.log" 2>&1 ||
      { grep -B2 -A12 "error" "$logs/build.log" | head -120; tail -3 "$logs/build.log"; exit 1; }
    echo "gpu_check: built ${targets[*]} in $((SECONDS - start)) s"
    ;;
  test)
    start=$SECONDS
    limit 300 $build/bin/test_cuda --durations yes 2>&1 | head -c 15000000 >"$logs/test_cuda.log"
    rc=${PIPESTATUS[0]}; echo "gpu_check: test_cuda exit $rc in $((SECONDS - start)) s"; ((rc)) && status=1
    grep -E "^test cases|^assertions|seconds: " "$logs/test_cuda.log" | sort -t: -k1,1 | tail -40
    start=$SECONDS
    limit 400 ctest --test-dir $build -L gpu -E "^cuda: all" --output-on-failure --timeout 300 \
      >"$logs/ctest_gpu.log" 2>&1
    rc=$?; echo "gpu_check: ctest -L gpu exit $rc in $((SECONDS - start)) s"; ((rc)) && status=1
    grep -E "tests passed|Failed|\*\*\*|Not Run|Test +#" "$logs/ctest_gpu.log" | head -40
    ;;
  suite)
    start=$SECONDS
    limit 600 ctest --test-dir $build -j"$(nproc)" -E "^cuda: all" --output-on-failure --timeout 300 \
      >"$logs/ctest.log" 2>&1
    rc=$?; echo "gpu_check: ctest exit $rc in $((SECONDS - start)) s"; ((rc)) && status=1
    grep -E "tests passed|Failed|\*\*\*|Not Run" "$logs/ctest.log" | head -40
    ;;
  sanitize)
    limit 240 env KILN_CUDA_NO_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
      $build/bin/test_cuda "~[op_table]~[nccl]" 2>&1 | tail -c 2000000 >"$logs/sanitize.log"
    rc=${PIPESTATUS[0]}; echo "gpu_check: compute-sanitizer memcheck exit $rc"; ((rc)) && status=1
    grep -E "ERROR SUMMARY|^test cases|^assertions|Invalid" "$logs/sanitize.log" | head -20
    ;;
  nccl-memcheck)
    # The NCCL tests under memcheck (sanitize leaves them out): each error with its stack, in the
    # log and, the first ones, on the output.
    limit 120 env KILN_CUDA_NO_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
      $build/bin/test_cuda "[nccl]" 2>&1 | tail -c 2000000 >"$logs/nccl_memcheck.log"
    rc=${PIPESTATUS[0]}; echo "gpu_check: compute-sanitizer memcheck over [nccl] exit $rc"
    grep -E -A8 "^========= (Invalid|Program hit|Error)" "$logs/nccl_memcheck.log" | head -60
    grep -E "ERROR SUMMARY|^test cases|^assertions" "$logs/nccl_memcheck.log"
    ;;
  train)
    data=$deps/share/datasets/fashion-mnist
    [[ -d $data ]] || data=$deps/share/datasets/fmnist-10k
    for model in cnn resnet; do
      limit 200 $build/bin/kiln-train --model $model --device cuda --data-root "$data" --epochs 2 \
        --out "$out/train-$model" --quiet 2>&1 | tail -3
      echo "gpu_check: kiln-train $model on the GPU exit ${PIPESTATUS[0]}"
    done
    rm -rf "$out"/train-*/checkpoint "$out"/train-*/*.png  # what comes back is limited
    ;;
  bench)
    # Kiln and PyTorch alternately, $rounds times each, on the same GPU.
    for ((round = 1; round <= rounds; ++round)); do
      limit 150 $build/bin/bench_cuda_ops | tee -a "$out/bench.jsonl"
      limit 150 python3 benchmarks/anchors/torch_cuda_ops.py | tee -a "$out/bench.jsonl"
    done
    # The CNN on Fashion-MNIST: the full set when it is there, else a folder that holds the 10k test
    # images as the training set too (bundle it as .deps/usr/share/datasets/fmnist-10k).
    data=$deps/share/datasets/fashion-mnist
    [[ -d $data ]] || data=$deps/share/datasets/fmnist-10k
    if [[ -d $data ]]; then
      for ((round = 1; round <= rounds; ++round)); do
        limit 150 $build/bin/bench_cnn_fmnist --epochs 3 --data "$data" --device cuda | tee -a "$out/bench.jsonl"
        limit 150 python3 benchmarks/anchors/torch_cnn_fmnist.py --epochs 3 --data "$data" --device cuda |
          tee -a "$out/bench.jsonl"
      done
    fi
    ;;
  gpt)
    # BENCHMARKS.md's gpt2_124m (Kiln against PyTorch eager with SDPA, alternately), the switches'
    # effects, where a step's time goes, gpt_char on the GPU against the PyTorch anchor, the fusion
    # benchmark, and last (its compilation takes minutes) PyTorch with torch.compile once.
    for ((round = 1; round <= rounds; ++round)); do
      limit 200 $build/bin/bench_gpt2 | tee -a "$out/gpt.jsonl"
      limit 200 python3 benchmarks/anchors/torch_gpt2.py | tee -a "$out/gpt.jsonl"
    done
    # The switches' effects: float16 with loss scaling and float32 on both sides, fusion off on Kiln's.
    for precision in fp16 none; do
      limit 200 $build/bin/bench_gpt2 --steps 15 --autocast $precision | tee -a "$out/gpt.jsonl"
      limit 200 python3 benchmarks/anchors/torch_gpt2.py --steps 15 --autocast $precision | tee -a "$out/gpt.jsonl"
    done
    limit 200 $build/bin/bench_gpt2 --steps 15 --no-fusion | tee -a "$out/gpt.jsonl"
    # Activation checkpointing and offload to pinned host memory: step time and peak device memory.
    for flag in --checkpoint --offload; do
      limit 200 $build/bin/bench_gpt2 --steps 15 $flag | tee -a "$out/gpt.jsonl"
    done
    # Where a step's time goes: each part of one block, forward and backward, both sides.
    limit 100 $build/bin/bench_gpt2 --breakdown | tee -a "$out/gpt.jsonl"
    limit 100 python3 benchmarks/anchors/torch_gpt2.py --breakdown | tee -a "$out/gpt.jsonl"
    # The WMMA attention kernels (cuda/attention.cu; the register-tiled ones are the default): their
    # breakdown and a whole GPT-2 run, for comparison.
    limit 100 env KILN_CUDA_ATTENTION=wmma $build/bin/bench_gpt2 --breakdown | tee -a "$out/gpt.jsonl"
    limit 200 env KILN_CUDA_ATTENTION=wmma $build/bin/bench_gpt2 | tee -a "$out/gpt.jsonl"
    # The corpus: bundle it as .deps/corpus/fortunes.txt (scripts/make_fortunes_corpus.sh writes it).
    corpus=$PWD/.deps/corpus/fortunes.txt
    if [[ -f $corpus ]]; then
      for ((round = 1; round <= rounds; ++round)); do
        limit 120 $build/bin/bench_gpt_char --device cuda --corpus "$corpus" | tee -a "$out/gpt.jsonl"
        limit 120 python3 benchmarks/anchors/torch_gpt_char.py --device cuda --corpus "$corpus" |
          tee -a "$out/gpt.jsonl"
      done
    fi
    limit 120 $build/bin/bench_fusion --device cuda | tee -a "$out/gpt.jsonl"
    limit 300 python3 benchmarks/anchors/torch_gpt2.py --compile 2>>"$logs/torch_compile.log" | grep "^{" | tail -1 |
      tee -a "$out/gpt.jsonl"
    ;;
  profile)
    # One GPT-2 step's GPU time per kernel: Kiln's (cuda::KernelProfiler, which opens libcupti: the
    # toolkit's, else the one in PyTorch's nvidia-cuda-cupti wheel) and PyTorch's (torch.profiler).
    cupti=$(ls /usr/local/cuda/extras/CUPTI/lib64/libcupti.so* /usr/local/cuda/lib64/libcupti.so* \
      /usr/local/cuda/lib/libcupti.so* 2>/dev/null | head -1)
    [[ -z $cupti ]] && cupti=$(python3 -c 'import glob, nvidia, os; print(next(iter(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib", "libcupti.so*")))), ""))' 2>/dev/null)
    echo "gpu_check: libcupti ${cupti:-not found}"
    limit 120 env LD_LIBRARY_PATH="${cupti:+$(dirname "$cupti"):}$LD_LIBRARY_PATH" $build/bin/bench_gpt2 --kernels \
      2>"$logs/kernels_kiln.txt" | tee -a "$out/kernels.jsonl" | grep '"(all)"'
    limit 120 python3 benchmarks/anchors/torch_gpt2.py --kernels 2>>"$logs/torch_profile.log" |
      tee -a "$out/kernels.jsonl" | grep '"(all)"'
    head -45 "$logs/kernels_kiln.txt"
    ;;
  dist)
    : >"$logs/dist.log"
    # One rank: busbw is 0 and the ring/native summary means nothing; the times and algbw are the figures.
    limit 200 $build/bin/kiln-run -n 1 $build/bin/bench_collectives $((256 << 20)) nccl 2>>"$logs/dist.log" |
      tee -a "$out/dist.jsonl"
    rc=${PIPESTATUS[0]}; echo "gpu_check: bench_collectives nccl exit $rc"; ((rc)) && status=1
    limit 300 $build/bin/kiln-run -n 2 $build/bin/bench_collectives $((64 << 20)) mpi cuda 2>>"$logs/dist.log" |
      tee -a "$out/dist.jsonl"
    rc=${PIPESTATUS[0]}; echo "gpu_check: bench_collectives mpi cuda exit $rc"; ((rc)) && status=1
    tail -5 "$logs/dist.log"
    ;;
  *)
    echo "gpu_check: unknown step '$step' (build, test, suite, sanitize, nccl-memcheck, train, bench, gpt, profile, dist)" >&2
    exit 2
    ;;
  esac
  pack_logs
done
exit $status
