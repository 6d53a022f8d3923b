#!/usr/bin/python3
"""bench_compare.py: runs Kiln's benchmark programs and their LibTorch (or PyTorch) anchors side by
side.

Siblings: the anchors are benchmarks/anchors/ (anchor_*.cpp, built by benchmarks/anchors/
CMakeLists.txt, and torch_gpt_char.py; described in benchmarks/anchors/README.md); the Kiln programs
bench_* are built by the top-level CMakeLists.txt; results files go to benchmarks/results/. Standard
library only.

For each bench NAME it runs BUILD/bin/bench_NAME (Kiln, with no tuning variables set: Kiln must be
good out of the box) and its anchor (at its best, with OMP_WAIT_POLICY=passive) alternately,
A B A B ..., for --rounds rounds. The anchor is BUILD_ANCHORS/bin/anchor_NAME (LibTorch), except
where ANCHOR_COMMANDS names another: checkpointing_mem's is the PyTorch script torch_gpt_char.py,
run once without and once with --checkpoint (LibTorch has no activation checkpointing), and
layer_norm's is the PyTorch script benchmarks/torch_layer_norm.py. Every stdout line that is a JSON
object is a result; figures are grouped by (bench, key) for the keys that start with gflops_ or us_,
the keys s_epoch_median, test_acc and peak_rss_mib, the bench's own keys of BENCH_KEYS (plus any
named with --keys), and split by case (n, ckpt, ...) where one side prints several. A table of
per-impl medians, min-max and the ratio kiln/anchor of the medians is printed, followed by one
PASS/FAIL line per target of BENCHMARKS.md that the run measured. With --out, a
JSON-lines file is written: a "meta" line (machine, date, commit, command), every raw result tagged
with its round, one "summary" line per key, then one "target" line per target checked. --dry-run
prints the commands of one round and runs nothing.

Example:
  scripts/bench_compare.py --kiln-bin build/release/bin --anchor-bin build/anchors/bin --rounds 3 \\
      --bench gemm,op_overhead --out benchmarks/results/2026-11-gemm.jsonl
  scripts/bench_compare.py --kiln-bin build/release/bin --anchor-bin build/anchors/bin --rounds 2 \\
      --bench mlp_fmnist,cnn_fmnist --out benchmarks/results/2026-11-fmnist.jsonl
  scripts/bench_compare.py --kiln-bin build/release/bin --anchor-bin build/anchors/bin --rounds 3 \\
      --bench gpt_char,checkpointing_mem --out benchmarks/results/2026-11-gpt.jsonl
"""

import argparse
import datetime
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

KILN = "kiln"
LIBTORCH = "libtorch"
PYTORCH = "pytorch"
ANCHOR = "anchor"  # --only anchor: whichever impl a bench's anchor is
DEFAULT_BENCHES = "gemm,op_overhead"
DEFAULT_PREFIXES = ("gflops_", "us_")
DEFAULT_KEYS = ("s_epoch_median", "test_acc", "peak_rss_mib")
# Keys compared for one bench only, besides the default ones.
BENCH_KEYS = {
    "gpt_char": ("ms_per_step", "loss_final"),
    "checkpointing_mem": ("ms_per_step", "loss_final"),
    "layer_norm": ("ms_median",),
}

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Anchors that are not BUILD_ANCHORS/bin/anchor_NAME: bench -> (impl, commands), each command run
# in turn every round (with the bench's --args appended). Debian's python3-torch is
# /usr/bin/python3's; another python3 on PATH may not have it.
TORCH_PYTHON = "/usr/bin/python3"
TORCH_GPT_CHAR = os.path.join(REPO_ROOT, "benchmarks", "anchors", "torch_gpt_char.py")
TORCH_LAYER_NORM = os.path.join(REPO_ROOT, "benchmarks", "torch_layer_norm.py")
ANCHOR_COMMANDS = {
    "checkpointing_mem": (PYTORCH, (
        (TORCH_PYTHON, TORCH_GPT_CHAR, "--bench", "checkpointing_mem"),
        (TORCH_PYTHON, TORCH_GPT_CHAR, "--bench", "checkpointing_mem", "--checkpoint"),
    )),
    "layer_norm": (PYTORCH, ((TORCH_PYTHON, TORCH_LAYER_NORM),)),
}

# The CPU targets of BENCHMARKS.md, checked on the summaries: (bench, key, what, op, bound), where
# what is "ratio" (the Kiln/anchor ratio of the medians) or "kiln" (Kiln's median itself), and op is
# "<=", ">=" or "within" (bound = (centre, tolerance): |value - centre| <= tolerance). A key that is
# compared per case (median_s once per n, say) is checked per case.
TARGETS = (
    ("gemm", "gflops_256", "ratio", ">=", 1.0),
    ("gemm", "gflops_512", "ratio", ">=", 1.0),
    ("gemm", "gflops_1024", "ratio", ">=", 1.0),
    ("gemm", "gflops_2048", "ratio", ">=", 1.0),
    ("op_overhead", "us_n1_nograd", "kiln", "<=", 0.35),
    ("op_overhead", "us_n64_nograd", "kiln", "<=", 0.35),
    ("op_overhead", "us_n1_grad", "kiln", "<=", 0.6),
    ("op_overhead", "us_n64_grad", "kiln", "<=", 0.6),
    ("mlp_fmnist", "s_epoch_median", "ratio", "<=", 0.8),
    ("mlp_fmnist", "test_acc", "kiln", ">=", 0.85),
    ("mlp_fmnist", "peak_rss_mib", "ratio", "<=", 0.5),
    ("cnn_fmnist", "s_epoch_median", "ratio", "<=", 0.8),
    ("cnn_fmnist", "test_acc", "kiln", ">=", 0.86),
    ("cnn_fmnist", "peak_rss_mib", "ratio", "<=", 0.6),
    ("gpt_char", "ms_per_step", "ratio", "<=", 0.8),
    ("gpt_char", "loss_final", "kiln", "within", (2.706, 0.05)),
    ("gpt_char", "peak_rss_mib", "ratio", "<=", 0.6),
)

# Variables that tune threading in OpenMP, OpenBLAS or MKL. They are removed from the environment of
# both programs so that an exported value in the caller's shell cannot change the result; the
# anchor then gets OMP_WAIT_POLICY=passive back, Kiln gets nothing.
TUNING_PREFIXES = ("OMP_", "GOMP_", "KMP_", "OPENBLAS_", "GOTO_", "MKL_")
ANCHOR_ENV = {"OMP_WAIT_POLICY": "passive"}

# Fields that tell apart the cases of one bench. A key printed by several cases (say median_s,
# once per n) is compared per case; keys such as gflops_256 already name their case.
CASE_FIELDS = ("n", "numel", "requires_grad", "dtype", "ckpt", "rows", "width", "part")


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Run Kiln benchmarks and their anchors alternately and compare them.")
    parser.add_argument("--kiln-bin", help="folder holding Kiln's bench_<name> programs")
    parser.add_argument("--anchor-bin", help="folder holding the anchor_<name> programs (not "
                        "needed for benches whose anchor is a script: %s)"
                        % ",".join(sorted(ANCHOR_COMMANDS)))
    parser.add_argument("--rounds", type=int, default=3, help="A B rounds per bench (default 3)")
    parser.add_argument("--bench", default=DEFAULT_BENCHES,
                        help="comma-separated bench names (default %s)" % DEFAULT_BENCHES)
    parser.add_argument("--keys", default="",
                        help="comma-separated extra numeric keys to compare (e.g. loss_final)")
    parser.add_argument("--args", action="append", default=[], metavar="NAME=ARGS",
                        help="extra arguments for both programs of bench NAME, e.g. "
                             "--args 'gemm=--sizes 256,512' (may be repeated)")
    parser.add_argument("--only", choices=[KILN, ANCHOR, LIBTORCH],
                        help="run one side only (e.g. to record anchor figures alone); "
                             "libtorch means the anchors, whichever impl they are")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds before one program run is killed (default 3600)")
    parser.add_argument("--out", help="write a JSON-lines results file here")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the commands of one round (and their environment additions) "
                             "and run nothing")
    args = parser.parse_args(argv)
    if args.only == LIBTORCH:
        args.only = ANCHOR
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    args.bench = [name for name in args.bench.split(",") if name]
    if args.only != ANCHOR and not args.kiln_bin:
        parser.error("--kiln-bin is required (unless --only anchor)")
    if (args.only != KILN and not args.anchor_bin
            and any(name not in ANCHOR_COMMANDS for name in args.bench)):
        parser.error("--anchor-bin is required (unless --only kiln)")
    args.keys = [key for key in args.keys.split(",") if key]
    extra = {}
    for item in args.args:
        name, sep, rest = item.partition("=")
        if not sep:
            parser.error("--args wants NAME=ARGS, got %r" % item)
        extra[name] = shlex.split(rest)
    args.args = extra
    return args


def clean_env(additions):
    env = {k: v for k, v in os.environ.items() if not k.startswith(TUNING_PREFIXES)}
    env.update(additions)
    return env


def is_executable(path):
    return os.path.isfile(path) and os.access(path, os.X_OK)


def anchor_of(name, anchor_bin):
    """(impl, list of commands) of bench name's anchor; a command is a list of arguments."""
    if name in ANCHOR_COMMANDS:
        impl, commands = ANCHOR_COMMANDS[name]
        return impl, [list(command) for command in commands]
    return LIBTORCH, [[os.path.join(anchor_bin or "", "anchor_" + name)]]


def missing_files(command):
    """The program of a command, and the script it runs if it is an interpreter, that are not
    there."""
    missing = [] if is_executable(command[0]) else [command[0]]
    if len(command) > 1 and command[1].endswith(".py") and not os.path.isfile(command[1]):
        missing.append(command[1])
    return missing


def run_program(command, env, timeout):
    """Runs one benchmark program (a list of arguments); returns (list of JSON result dicts, error
    text or None)."""
    start = time.monotonic()
    try:
        proc = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [], "timed out after %.0f s" % timeout
    except OSError as err:
        return [], "could not start: %s" % err
    elapsed = time.monotonic() - start
    results = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            results.append(record)
    error = None
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-5:]
        error = "exit status %d%s" % (proc.returncode, (": " + " | ".join(tail)) if tail else "")
    elif not results:
        error = "printed no JSON result lines"
    print("  %-40s %6.1f s, %d results%s" % (
        shown_command(command), elapsed, len(results),
        "" if error is None else " -- " + error), file=sys.stderr)
    return results, error


def shown_command(command):
    """The command as printed: the program's base name (and the script's, for an interpreter)."""
    shown = [os.path.basename(command[0])]
    rest = command[1:]
    if rest and rest[0].endswith(".py"):
        shown.append(os.path.basename(rest[0]))
        rest = rest[1:]
    return " ".join(shown + rest)


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def better_direction(key):
    """'higher' or 'lower' is better for this key, or '?' if the name does not say."""
    k = key.lower()
    if k.endswith("per_s") or "per_s_" in k or k.startswith(("gflops", "tflops", "gbps", "tokens")) or "acc" in k:
        return "higher"
    if k.startswith(("us_", "ms_", "s_")) or k.endswith(("_us", "_ms", "_s")):
        return "lower"
    if "rss" in k or "mib" in k or "loss" in k or "bytes" in k:
        return "lower"
    return "?"


def summarize(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def machine_info():
    info = {"cpu": "unknown", "nproc": None, "mem_total": "unknown"}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        info["nproc"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        info["nproc"] = os.cpu_count()
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    info["mem_total"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def git_commit():
    def git(*git_args):
        return subprocess.run(["git", "-C", REPO_ROOT] + list(git_args), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, universal_newlines=True)
    try:
        head = git("rev-parse", "HEAD")
        status = git("status", "--porcelain")
    except OSError:
        return "unknown"
    commit = head.stdout.strip() if head.returncode == 0 else "no-commits"
    if status.returncode == 0 and status.stdout.strip():
        commit += "-dirty"
    return commit


def check_targets(summaries):
    """One "target" record per target of TARGETS that the summaries measured with a Kiln figure; a
    ratio target without an anchor figure (a run with --only kiln) is reported as not checked."""
    checks = []
    for bench, key, what, op, bound in TARGETS:
        for s in summaries:
            if s["bench"] != bench or s["key"] != key or s[KILN] is None:
                continue
            if what == "ratio":
                value = s["ratio_kiln_over_" + s["anchor"]]
                name = "kiln/" + s["anchor"]
            else:
                value = s[KILN]["median"] if s[KILN] else None
                name = "kiln median"
            if value is None:
                verdict = "NOT CHECKED"
                shown = "no %s figure" % name
            elif op == "within":
                centre, tolerance = bound
                verdict = "PASS" if abs(value - centre) <= tolerance else "FAIL"
                shown = "%s %.4g within %g of %g" % (name, value, tolerance, centre)
            else:
                passed = value <= bound if op == "<=" else value >= bound
                verdict = "PASS" if passed else "FAIL"
                shown = "%s %.4g %s %g" % (name, value, op, bound)
            line = "%-11s %s %s: %s" % (verdict, bench, s["label"], shown)
            checks.append({"record": "target", "bench": bench, "key": key, "label": s["label"],
                           "case": s["case"], "what": what, "op": op, "bound": bound,
                           "value": value, "verdict": verdict, "line": line})
    return checks


def format_figure(stats):
    if stats is None:
        return "-"
    return "%.4g [%.4g-%.4g]" % (stats["median"], stats["min"], stats["max"])


def main(argv):
    args = parse_args(argv)
    command = shlex.join([sys.executable] + [sys.argv[0]] + argv)
    meta = {"record": "meta", "machine": machine_info(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "git_commit": git_commit(), "command": command}

    raw = []       # every result line, tagged with round
    errors = []    # runs that failed
    skipped = []   # benches not run, with the reason
    for name in args.bench:
        # The programs of one round, in order: (impl, command, env, environment additions).
        extra_args = args.args.get(name, [])
        programs = []
        if args.only != ANCHOR:
            programs.append((KILN, [os.path.join(args.kiln_bin, "bench_" + name)] + extra_args,
                             clean_env({}), {}))
        if args.only != KILN:
            anchor_impl, commands = anchor_of(name, args.anchor_bin)
            programs += [(anchor_impl, command + extra_args, clean_env(ANCHOR_ENV), ANCHOR_ENV)
                         for command in commands]
        missing = [(impl, path) for impl, command, _, _ in programs
                   for path in missing_files(command)]
        if args.dry_run:
            print("%s, each round (both sides without the variables %s*):"
                  % (name, "*, ".join(TUNING_PREFIXES)))
            for impl, command, _, additions in programs:
                print("  %-8s %s%s" % (impl, "".join("%s=%s " % item for item in additions.items()),
                                       shlex.join(command)))
            for impl, path in missing:
                print("  missing: %s program %s" % (impl, path))
            continue
        if missing:
            for impl, path in missing:
                reason = "%s program %s is missing (not built?)" % (impl, path)
                print("SKIP %s: %s" % (name, reason), file=sys.stderr)
                skipped.append({"record": "skipped", "bench": name, "reason": reason})
            continue
        for round_index in range(1, args.rounds + 1):
            print("%s round %d/%d" % (name, round_index, args.rounds), file=sys.stderr)
            for impl, command, env, _ in programs:
                results, error = run_program(command, env, args.timeout)
                if error is not None:
                    errors.append({"record": "error", "bench": name, "impl": impl,
                                   "round": round_index, "program": shlex.join(command),
                                   "error": error})
                for result in results:
                    tagged = {"record": "result", "round": round_index, "bench": name,
                              "impl": impl}
                    tagged.update(result)
                    tagged["record"] = "result"
                    tagged["round"] = round_index
                    raw.append(tagged)
    if args.dry_run:
        return 0

    # Group figures by (bench, key) and impl, in first-seen order. A key that one impl prints for
    # several cases in one round (median_s once per n, say) is split further by case.
    entries = []
    cases_seen = {}
    for result in raw:
        case = tuple((field, result[field]) for field in CASE_FIELDS if field in result)
        for key, value in result.items():
            if ((key.startswith(DEFAULT_PREFIXES) or key in DEFAULT_KEYS or key in args.keys
                    or key in BENCH_KEYS.get(result["bench"], ())) and is_number(value)):
                entries.append((result["bench"], key, case, result["impl"], float(value)))
                cases_seen.setdefault((result["bench"], key, result["impl"], result["round"]),
                                      set()).add(case)
    split = {(bench, key) for (bench, key, _, _), cases in cases_seen.items() if len(cases) > 1}
    groups = {}
    for bench, key, case, impl, value in entries:
        group_case = case if (bench, key) in split else ()
        groups.setdefault((bench, key, group_case), {}).setdefault(impl, []).append(value)

    summaries = []
    for (bench, key, case), by_impl in groups.items():
        label = key
        if case:
            label += " (%s)" % ", ".join("%s=%s" % (f, json.dumps(v)) for f, v in case)
        anchor_impl = anchor_of(bench, args.anchor_bin)[0]
        kiln = summarize(by_impl[KILN]) if KILN in by_impl else None
        anchor = summarize(by_impl[anchor_impl]) if anchor_impl in by_impl else None
        ratio = None
        if kiln and anchor and anchor["median"] != 0:
            ratio = kiln["median"] / anchor["median"]
        summaries.append({"record": "summary", "bench": bench, "key": key, "label": label,
                          "case": dict(case), "better": better_direction(key),
                          "anchor": anchor_impl, KILN: kiln, anchor_impl: anchor,
                          "ratio_kiln_over_" + anchor_impl: ratio})

    header = ("bench", "key", "better", "kiln median [min-max]", "anchor",
              "anchor median [min-max]", "kiln/anchor")
    rows = [header]
    for s in summaries:
        ratio = s["ratio_kiln_over_" + s["anchor"]]
        rows.append((s["bench"], s["label"], s["better"], format_figure(s[KILN]), s["anchor"],
                     format_figure(s[s["anchor"]]), "-" if ratio is None else "%.3f" % ratio))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    print()
    if summaries:
        for row in rows:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        print("(rounds: %d; ratio < 1 is good for Kiln where lower is better, > 1 where higher is)"
              % args.rounds)
    else:
        print("no results to compare")
    for item in skipped:
        print("skipped %s: %s" % (item["bench"], item["reason"]))
    for item in errors:
        print("error in %s round %d (%s): %s" % (item["bench"], item["round"], item["impl"],
                                                 item["error"]))

    checks = check_targets(summaries)
    if checks:
        print("targets (BENCHMARKS.md):")
    for check in checks:
        print("  " + check["line"])

    if args.out:
        out_dir = os.path.dirname(os.path.abspath(args.out))
        os.makedirs(out_dir, exist_ok=True)
        with open(args.out, "w") as f:
            for record in [meta] + raw + skipped + errors + summaries + checks:
                f.write(json.dumps(record) + "\n")
        print("wrote %s" % args.out)

    return 1 if errors or (skipped and not summaries) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
