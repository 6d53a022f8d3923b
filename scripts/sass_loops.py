#!/usr/bin/python3
"""sass_loops.py: the loops of a CUDA kernel's machine code (SASS), with their instruction counts.

A memory-bound kernel is only as fast as the memory while a multiprocessor can issue its
instructions in the time the memory takes (an H100 or H200 issues 4 warp-instructions a cycle per
multiprocessor: about 60 an element for a float32 op that moves 8 bytes at 4.2 TB/s, 30 for a
16-bit one). Counting them needs no GPU: compile the .cu file for sm_90 and read the object's SASS.
docs/cuda.md gives the counts this script printed for the kernels changed by such readings (GELU,
attention, cross-entropy).

  # one object, as the build compiles it (see compile_commands.json for the full nvcc line)
  nvcc ... -c cuda/fused.cu -o /tmp/fused.o
  scripts/sass_loops.py /tmp/fused.o cross_entropy_backward_kernel

cuobjdump comes with the CUDA toolkit (bin/cuobjdump); where the toolkit lacks it, PyPI's
nvidia-cuda-cuobjdump wheel holds the same program (unzip it; nvidia/cu13/bin/cuobjdump). Set
CUOBJDUMP to its path if it is not on PATH.

For each kernel whose mangled or demangled name contains the pattern: its instruction count, then
each loop (a backward branch) with its instruction count and the count of a few kinds of interest
(HMMA: tensor-core products; MUFU: exp2, rcp and the like; LDG/STG/LDGSTS: global memory). A loop
inside another is listed too; its instructions run once per trip, the outer loop's listing counts
them once.
"""
import os
import re
import shutil
import subprocess
import sys

KINDS = ("HMMA", "MUFU", "LDG", "STG", "LDGSTS", "BAR")


def disassemble(obj):
    tool = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not tool:
        sys.exit("sass_loops.py: cuobjdump not found (set CUOBJDUMP; see the header of this script)")
    return subprocess.run([tool, "-sass", obj], check=True, capture_output=True, text=True).stdout


def functions(sass):
    for part in re.split(r"\n\s*Function : ", sass)[1:]:
        name = part.split("\n", 1)[0].strip()
        code = []
        for line in part.split("\n"):
            m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
            if m:
                code.append((int(m.group(1), 16), m.group(2)))
        yield name, code


def demangle(name):
    filt = shutil.which("c++filt")
    if not filt:
        return name
    return subprocess.run([filt, name], capture_output=True, text=True).stdout.strip()


def opcode(text):
    m = re.match(r"(@!?U?P\w+\s+)?([A-Z0-9_]+)", text)
    return m.group(2) if m else ""


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    obj, pattern = sys.argv[1], sys.argv[2]
    found = False
    for name, code in functions(disassemble(obj)):
        pretty = demangle(name)
        if pattern not in name and pattern not in pretty:
            continue
        found = True
        print(f"{pretty[:160]}: {len(code)} instructions")
        for address, text in code:
            m = re.search(r"BRA (?:!?U?P\d, )?(0x[0-9a-f]+)", text)
            if not m or int(m.group(1), 16) >= address:
                continue
            start = int(m.group(1), 16)
            body = [opcode(t) for a, t in code if start <= a <= address]
            kinds = ", ".join(f"{k} {sum(op == k for op in body)}" for k in KINDS if k in body)
            print(f"  loop {start:#06x}-{address:#06x}: {len(body)} instructions" + (f" ({kinds})" if kinds else ""))
    if not found:
        sys.exit(f"sass_loops.py: no kernel in {obj} matches {pattern!r}")


if __name__ == "__main__":
    main()
