#!/usr/bin/env bash
# scripts/install-deps.sh: installs, from Debian 12's packages, whatever Kiln's build and tests need
# that this machine lacks. Runs apt-get through sudo when not root. Touches nothing already installed.
#   --bench   also LibTorch and PyTorch, the benchmark anchors (about 1 GB)
set -euo pipefail
pkgs=(cmake ninja-build g++ ccache libeigen3-dev libfmt-dev nlohmann-json3-dev catch2 zlib1g-dev
      libopenblas-dev libopenmpi-dev openmpi-bin dataset-fashion-mnist gnuplot-nox fortunes python3-numpy)
[[ ${1:-} == --bench ]] && pkgs+=(libtorch-dev python3-torch)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: everything is installed"
  exit 0
fi
as_root=()
[[ $(id -u) -eq 0 ]] || as_root=(sudo)
echo "install-deps: installing ${missing[*]}"
"${as_root[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
