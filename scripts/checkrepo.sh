#!/usr/bin/env bash
# checkrepo: fail when git tracks a built executable or a file over 1 MiB (run by make check).
# A tracked file may be executable only as a script (it starts with "#!"); binaries belong in
# bin/ (make build), which .gitignore keeps out of the repository.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

limit=$((1024 * 1024))
bad=0
# mode, object, stage and path of every tracked file, as the index holds them.
while IFS= read -r -d '' line; do
	meta=${line%%$'\t'*}
	path=${line#*$'\t'}
	read -r mode object _ <<<"$meta"
	[ "$mode" = 120000 ] || [ "$mode" = 160000 ] && continue # symlink, submodule
	size=$(git cat-file -s "$object")
	if [ "$size" -gt "$limit" ]; then
		echo "checkrepo: $path: $size bytes, over the 1 MiB limit for tracked files" >&2
		bad=1
	fi
	magic=$( (git cat-file blob "$object" || true) | head -c 4 | od -An -tx1 | tr -d ' \n')
	case "$magic" in
	7f454c46* | cffaedfe* | cefaedfe* | feedface* | feedfacf* | 4d5a*)
		echo "checkrepo: $path: an executable binary (ELF, Mach-O or PE); build into bin/ instead" >&2
		bad=1
		continue
		;;
	esac
	if [ "$mode" = 100755 ] && [ "${magic:0:4}" != 2321 ]; then
		echo "checkrepo: $path: executable but not a script (no #! line)" >&2
		bad=1
	fi
done < <(git ls-files -s -z)
exit "$bad"
