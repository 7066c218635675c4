#!/usr/bin/env bash
# Prints the Debian packages providing the shared libraries the given binaries load (ldd), one
# per line, sorted; fails naming a library that is not found or that no package owns. The
# image's runtime stage must install them: runtime_libs_test compares with runtime-packages.txt.
#   runtime_libs.sh [--except=SONAME,...] BINARY...
# --except: libraries accounted for elsewhere (runtime-packages-cuda.txt's CUDA libraries, which
# no Debian package provides and which a machine without CUDA may not have), by ldd's name.
set -euo pipefail

except=","
if [[ "${1:-}" == --except=* ]]; then
  except=",${1#--except=},"
  shift
fi

# Every resolved library path of the binaries, once; exits 1 naming what ldd cannot find.
libraries_of() {
  local status=0 binary library arrow path
  for binary in "$@"; do
    if [[ ! -x "$binary" ]]; then
      echo "runtime_libs: $binary is not an executable" >&2
      status=1
      continue
    fi
    while read -r library arrow path _; do
      [[ "$arrow" == "=>" ]] || continue
      [[ "$except" == *",$library,"* ]] && continue
      if [[ "$path" == "not" ]]; then
        echo "runtime_libs: $binary: $library not found" >&2
        status=1
      else
        realpath "$path"
      fi
    done < <(ldd "$binary")
  done
  return $status
}

libraries=$(libraries_of "$@" | sort -u) || exit 1
# One dpkg query for all of them; merged-/usr systems register either spelling of a path.
declare -A owner=()
# dpkg -S prints "package[:arch][, package...]: path".
while read -r package path; do
  owner[$path]=$package
done < <(for library in $libraries; do echo "$library" "/usr$library" "${library#/usr}"; done |
  xargs dpkg -S 2>/dev/null | sed -E 's/^([^:,]+)[^ ]*: (.*)$/\1 \2/')
# The loop runs in the pipeline's subshell: it exits with its own status (a library that no
# package owns fails the script), which PIPESTATUS carries out.
{
  status=0
  for library in $libraries; do
    package=${owner[$library]:-${owner[/usr$library]:-${owner[${library#/usr}]:-}}}
    if [[ -z "$package" ]]; then
      echo "runtime_libs: no Debian package owns $library" >&2
      status=1
    else
      echo "$package"
    fi
  done
  exit "$status"
} | sort -u
exit "${PIPESTATUS[0]}"
