#!/usr/bin/env bash
# benchvs.sh: the benchmarks of this working tree against those of an older commit, measured
# in one run on this machine (`make benchvs`; docs/benchmarks.md, "How to reproduce").
#
# Usage: BASE=<commit> BENCHPKGS="pkg ..." BENCH=<regexp> COUNT=<rounds> BENCHTIME=<d> scripts/benchvs.sh
#
# It builds each package's test binary at BASE (from `git archive`, in a temporary directory)
# and from the working tree, runs COUNT rounds in which every package's base and current
# binaries run the benchmarks matching BENCH, each from its own package directory (the base
# first in odd rounds, this tree first in even ones), appending to benchvs-base.out and
# benchvs-head.out, and then prints the comparison (benchcheck -base). A package missing at
# BASE is skipped with a message.
set -euo pipefail
: "${BASE:?BASE: the commit to compare with}" "${COUNT:=4}" "${BENCHTIME:=2s}" "${BENCH:=.}" "${GO:=go}"
if [ -z "${BENCHPKGS:-}" ]; then
	echo "benchvs: BENCHPKGS is empty: name the packages to compare (e.g. ledger/postgres)" >&2
	exit 2
fi
if ! git rev-parse --verify -q "$BASE^{commit}" >/dev/null; then
	echo "benchvs: BASE=$BASE is not a commit of this repository" >&2
	exit 2
fi
root=$(pwd)
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
trap 'exit 130' INT TERM
git archive "$BASE" | tar -x -C "$src"
rm -rf bin/benchvs && mkdir -p bin/benchvs
pkgs=()
for p in $BENCHPKGS; do
	if [ ! -d "$src/$p" ]; then
		echo "benchvs: $p does not exist at $BASE: skipped" >&2
		continue
	fi
	n=${p//\//-}
	echo "benchvs: building $p at $BASE and here" >&2
	(cd "$src" && "$GO" test -c -o "$root/bin/benchvs/base-$n.test" "./$p/")
	"$GO" test -c -o "$root/bin/benchvs/head-$n.test" "./$p/"
	pkgs+=("$p")
done
if [ ${#pkgs[@]} -eq 0 ]; then
	echo "benchvs: no package of BENCHPKGS exists at $BASE" >&2
	exit 2
fi
# run DIR BINARY OUT: BINARY's benchmarks, from DIR, appended to OUT.
run() {
	(cd "$1" && "$2" -test.run '^$' -test.bench "$BENCH" -test.benchtime "$BENCHTIME") >>"$3"
}
rm -f benchvs-base.out benchvs-head.out
for i in $(seq "$COUNT"); do
	for p in "${pkgs[@]}"; do
		n=${p//\//-}
		echo "benchvs: round $i of $COUNT: $p" >&2
		if [ $((i % 2)) -eq 1 ]; then
			run "$src/$p" "$root/bin/benchvs/base-$n.test" benchvs-base.out
			run "$root/$p" "$root/bin/benchvs/head-$n.test" benchvs-head.out
		else
			run "$root/$p" "$root/bin/benchvs/head-$n.test" benchvs-head.out
			run "$src/$p" "$root/bin/benchvs/base-$n.test" benchvs-base.out
		fi
	done
done
"$GO" run ./internal/checks/benchcheck -base benchvs-base.out benchvs-head.out
