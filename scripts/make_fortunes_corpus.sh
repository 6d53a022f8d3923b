#!/usr/bin/env bash
# make_fortunes_corpus.sh: builds the byte corpus of BENCHMARKS.md "e. gpt_char" (and "f.
# checkpointing_mem") and checks it. Siblings: benchmarks/anchors/corpus_anchor.h builds the same
# bytes in memory for the LibTorch anchor; benchmarks/anchors/torch_gpt_char.py for the PyTorch one;
# Kiln's bench_gpt_char reads the file this script writes (--corpus PATH).
#
#   scripts/make_fortunes_corpus.sh [OUT]      # OUT defaults to build/fortunes-corpus.txt
#                                              # (relative to the repository root)
#
# The rule, which reproduces the stated size and sha256 (checked against Debian's fortunes
# 1:1.99.1-7.3 and base-files 12.4+deb12u11):
#   1. the regular files directly in /usr/share/games/fortunes whose name does not end in ".dat"
#      (43 files). Symbolic links are left out: every "NAME.u8" there is a link to NAME, and
#      following them would count each file twice (5,456,424 bytes with the licence links below).
#      Only the top level is read: the package has no subfolders, and the "off/" folder that
#      fortunes-off adds is not part of the corpus.
#   2. then the regular files directly in /usr/share/common-licenses (14 files), again without the
#      links (GFDL, GPL and LGPL point at GFDL-1.3, GPL-3 and LGPL-3).
#   Each list is sorted by path in the C locale (LC_ALL=C: bytewise, so "GPL-1" < "art" would hold
#   if both were in one list), and all files are concatenated in that order, with nothing between.
# Result: 2,813,994 bytes, sha256 7d133a207829a050f4c113d97a7e248303704ab094a0592864f07cc23a159c03.
#
# The file is written to a temporary file next to OUT and renamed into place, so a reader never
# sees a half-written corpus. Exits non-zero, naming the fix, if the package is missing or the bytes
# differ (another fortunes version, or another package that adds files to those folders).

set -euo pipefail
export LC_ALL=C

readonly kFortunes=/usr/share/games/fortunes
readonly kLicenses=/usr/share/common-licenses
readonly kSize=2813994
readonly kSha256=7d133a207829a050f4c113d97a7e248303704ab094a0592864f07cc23a159c03
readonly kPackageHint="install Debian's fortunes 1:1.99.1-7.3 (apt-get install fortunes)"

die() {
  echo "make_fortunes_corpus.sh: $*" >&2
  exit 1
}

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$repo_root/build/fortunes-corpus.txt}"

if [[ ! -d "$kFortunes" ]] || [[ ! -f "$kFortunes/fortunes" ]]; then
  die "$kFortunes is missing; $kPackageHint"
fi
[[ -d "$kLicenses" ]] || die "$kLicenses is missing (it comes with Debian's base-files)"
if version="$(dpkg-query -W -f='${Version}' fortunes 2>/dev/null)" &&
  [[ "$version" != "1:1.99.1-7.3" ]]; then
  echo "make_fortunes_corpus.sh: warning: fortunes is version $version, not 1:1.99.1-7.3" >&2
fi

# The two sorted lists, one path a line (none of these names holds a newline).
mapfile -t files < <(
  find "$kFortunes" -mindepth 1 -maxdepth 1 -type f ! -name '*.dat' | sort
  find "$kLicenses" -mindepth 1 -maxdepth 1 -type f | sort
)

mkdir -p "$(dirname "$out")"
tmp="$(mktemp "$out.tmp.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
cat -- "${files[@]}" >"$tmp"

size="$(stat -c %s "$tmp")"
sha="$(sha256sum "$tmp" | cut -d' ' -f1)"
if [[ "$size" != "$kSize" || "$sha" != "$kSha256" ]]; then
  die "the corpus from ${#files[@]} files is $size bytes with sha256 $sha; expected $kSize bytes" \
    "with sha256 $kSha256. $kPackageHint (and no other fortunes-* package that adds files to" \
    "$kFortunes)"
fi

chmod 644 "$tmp"
mv -f "$tmp" "$out"
trap - EXIT
echo "wrote $out: $size bytes from ${#files[@]} files, sha256 $sha"
