#!/usr/bin/env bash
# Lints the GitHub Actions workflows, which cannot run here (`make lint` runs this):
#   1. actionlint, built from its published Go module by build-binaries.sh (the `lint` profile),
#      checks their syntax, expressions, contexts, action inputs and job wiring;
#   2. every command of this repository a workflow calls exists: each `make TARGET` is a target
#      of the Makefile, each repository script path (scripts/..., tests/harness/...) is an
#      executable file, and each build-binaries.sh profile it names is one the script accepts.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
shopt -s nullglob
workflows=(.github/workflows/*.yml .github/workflows/*.yaml)
((${#workflows[@]})) || { echo "lint-workflows: no workflow in .github/workflows" >&2; exit 1; }

bin=$(tests/harness/build-binaries.sh lint | tail -n 1)
"$bin/actionlint" "${workflows[@]}"

python3 - "${workflows[@]}" <<'PY'
import re, subprocess, sys
targets = set(re.findall(r"^([A-Za-z0-9_.-]+):", open("Makefile").read(), re.M))
usage = subprocess.run(["tests/harness/build-binaries.sh", "--help"], capture_output=True, text=True).stderr
profiles = set(re.search(r"\[([a-z0-9|]+)\]", usage).group(1).split("|"))
import os
errors = []
for path in sys.argv[1:]:
    for n, line in enumerate(open(path), 1):
        code = line.split("#", 1)[0] if not line.lstrip().startswith("- uses:") else ""
        for t in re.findall(r"(?<![\w/-])make\s+((?:[A-Za-z_]+=\S*\s+)*)([a-z][\w-]*)", code):
            if t[1] not in targets:
                errors.append(f"{path}:{n}: `make {t[1]}`: no such target in the Makefile")
        for p in re.findall(r"(?<![\w/.-])((?:\./)?(?:scripts|tests/harness|\.ci)/[\w./-]+)", code):
            if not (os.path.isfile(p) and os.access(p, os.X_OK)):
                errors.append(f"{path}:{n}: {p}: not an executable file of the repository")
            elif p.endswith("build-binaries.sh"):
                after = code.split(p, 1)[1].split()
                if after and re.fullmatch(r"[a-z0-9]+", after[0]) and after[0] not in profiles:
                    errors.append(f"{path}:{n}: build-binaries.sh has no profile {after[0]}")
for e in errors:
    print(e, file=sys.stderr)
sys.exit(1 if errors else 0)
PY
echo "lint-workflows: ${workflows[*]} pass actionlint, and every repository command they call exists"
