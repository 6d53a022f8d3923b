#!/usr/bin/env bash
# gpu_bundle.sh: puts into ./.deps what scripts/gpu_check.sh needs on a GPU machine that has CUDA,
# CMake and Ninja but cannot reach a package registry, sized to travel with the source tree (a
# device machine takes a working tree of at most 64 MiB). Run it here, where apt-get works, in the
# repository's root; .deps is then ignored by git (.git/info/exclude) and must be carried along.
#
#   scripts/gpu_bundle.sh            # about 50 MiB with the tree; says so and fails above 60 MiB
#
# What goes in, in Debian's layout (.deps/usr/...), so that CMake finds the packages' own files:
#   - the build dependencies (Eigen, fmt, nlohmann-json, Catch2, zlib), and Open MPI's runtime and
#     headers with the libraries it loads (MPI is the MPI backend and NCCL's bootstrap), with the
#     names Debian's alternatives would give them (mpirun, mpicxx); Open MPI's Fortran and Java
#     bindings, documentation and manual pages are left out;
#   - .deps/usr/share/datasets/fmnist-10k: Fashion-MNIST's 10,000 test images, which also serve as
#     its training set (links), since the full set (30 MB) does not fit; gpu_check.sh's train and
#     bench steps take it when the full set is absent;
#   - .deps/corpus/fortunes.txt: BENCHMARKS.md's gpt_char corpus (scripts/make_fortunes_corpus.sh),
#     when the fortunes package is installed (scripts/install-deps.sh installs it).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
dest=$PWD/.deps
pkgs=(libeigen3-dev libfmt-dev libfmt9 nlohmann-json3-dev catch2 zlib1g-dev zlib1g
      libopenmpi-dev libopenmpi3 openmpi-bin openmpi-common libhwloc15 libhwloc-plugins libevent-core-2.1-7
      libevent-pthreads-2.1-7 libpmix2 libfabric1 libucx0 libibverbs1 ibverbs-providers librdmacm1 libnl-3-200
      libnl-route-3-200 libpsm2-2 libpsm-infinipath1 libnuma1 libudev1 libmunge2 dataset-fashion-mnist)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! (cd "$work" && apt-get download "${pkgs[@]}" >"$work/log" 2>&1); then
  cat "$work/log" >&2
  echo "gpu_bundle: apt-get download failed; run 'apt-get update' and try again" >&2
  exit 1
fi
rm -rf "$dest.new"
mkdir -p "$dest.new"
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$dest.new"; done
usr=$dest.new/usr
# Debian 12 merges /lib into /usr/lib; some packages still ship files under /lib.
if [[ -d $dest.new/lib ]]; then
  cp -a "$dest.new/lib/." "$usr/lib/"
  rm -rf "$dest.new/lib"
fi
# A link to an absolute path (libz.so -> /lib/x86_64-linux-gnu/libz.so.1) would leave the bundle.
find "$dest.new" -type l -lname '/*' | while read -r link; do
  ln -sfn "$(basename "$(readlink "$link")")" "$link"
done
multiarch=$usr/lib/x86_64-linux-gnu
# The names Debian's alternatives give Open MPI (mpirun, mpicxx, mpi.h's folder, libmpi.so), which
# dpkg-deb -x does not make: kiln-run and CMake's FindMPI look for these.
for tool in mpirun mpiexec mpicc mpicxx mpic++; do ln -sfn "$tool.openmpi" "$usr/bin/$tool"; done
ln -sfn openmpi "$usr/include/x86_64-linux-gnu/mpi"
ln -sfn openmpi/lib/libmpi.so "$multiarch/libmpi.so"
rm -rf "$usr/share/doc" "$usr/share/man" "$usr/share/lintian" "$multiarch/fortran" "$multiarch/openmpi/lib/"*java* \
  "$multiarch/openmpi/lib/"*mpifh* "$multiarch/openmpi/lib/"*usempi* "$multiarch/"*mpi_java* "$multiarch/"*mpifh* \
  "$multiarch/"*usempi*
# Fashion-MNIST: the test set, and the same files again as the training set.
data=$usr/share/datasets
mkdir -p "$data/fmnist-10k"
mv "$data/fashion-mnist/t10k-"* "$data/fmnist-10k/"
rm -rf "$data/fashion-mnist"
ln -s t10k-images-idx3-ubyte.gz "$data/fmnist-10k/train-images-idx3-ubyte.gz"
ln -s t10k-labels-idx1-ubyte.gz "$data/fmnist-10k/train-labels-idx1-ubyte.gz"
if [[ -d /usr/share/games/fortunes ]]; then
  scripts/make_fortunes_corpus.sh "$dest.new/corpus/fortunes.txt" >/dev/null
else
  echo "gpu_bundle: the fortunes package is not installed: no gpt_char corpus (scripts/install-deps.sh installs it)" >&2
fi
rm -rf "$dest"
mv "$dest.new" "$dest"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.deps/' "$exclude" 2>/dev/null || echo '/.deps/' >>"$exclude"
# What travels: the files git tracks or sees untracked, and .deps.
tree=$({ git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null || true; } |
       awk '{s += $1} END {print s + 0}')  # a tracked file deleted from the tree counts nothing
bundle=$(du -sb "$dest" | cut -f1)
total_mib=$(((tree + bundle) >> 20))
echo "gpu_bundle: .deps is $((bundle >> 20)) MiB; with the tree $total_mib MiB travel (at most 64)"
if ((total_mib > 60)); then
  echo "gpu_bundle: too large to travel; remove untracked files or leave something out of .deps" >&2
  exit 1
fi
