#!/bin/sh
# make test's closing line, "N passed, N failed, N skipped", over the plain run, the ASan run
# and the fuzz pass (Makefile, "check" and "test"). It counts test cases:
#   - a cmocka program: its cases, from cmocka's "[  PASSED  ] N test(s)." lines and the like
#     (a case that called skip() is skipped: no AMX, no redis-server, a sanitizer build);
#   - a Python unittest program (make python-check): its cases, from "Ran N tests" and the
#     "OK (skipped=K)" / "FAILED (failures=F, errors=E)" line;
#   - the fuzz pass: one case per target ("fuzz_NAME: ok" or "FAILED"), every target skipped
#     when fuzzing is ("fuzz: skipped: ..." without clang);
#   - any other program (the install test): one case, passed when it exits 0, skipped on 77.
# A program that exits non-zero with no failed case counted (a crash, a sanitizer report at
# exit) counts one failed case more.
#
#   tally.sh run RESULTS NAME COMMAND...  run COMMAND, its output shown as it comes; append
#                                          "PASSED FAILED SKIPPED NAME" to RESULTS; exit with
#                                          COMMAND's status
#   tally.sh skip RESULTS N NAME           N skipped cases of NAME
#   tally.sh summary STATUS RESULTS...     the closing line over the files that exist; STATUS
#                                          is the run's exit status: a failure that no case
#                                          shows (a build error) counts as one failed case
set -u

sum() { awk '{ s += $1 } END { print s + 0 }'; }

# Counts of one program's output file and exit status: "PASSED FAILED SKIPPED".
count() { # LOG STATUS
  log=$1 status=$2
  p=$(sed -n 's/^\[  PASSED  \] \([0-9][0-9]*\) test.*/\1/p' "$log" | sum)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9][0-9]*\) test.*/\1/p' "$log" | sum)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9][0-9]*\) test.*/\1/p' "$log" | sum)
  seen=$(grep -c '^\[==========\] [0-9][0-9]* test(s) run\.' "$log")
  ran=$(sed -n 's/^Ran \([0-9][0-9]*\) tests\{0,1\} in .*/\1/p' "$log" | sum)
  if grep -q '^Ran [0-9][0-9]* tests\{0,1\} in ' "$log"; then
    seen=1
    us=$(sed -n 's/^\(OK\|FAILED\) (.*skipped=\([0-9][0-9]*\).*/\2/p' "$log" | sum)
    uf=$(sed -n 's/^FAILED (.*failures=\([0-9][0-9]*\).*/\1/p' "$log" | sum)
    ue=$(sed -n 's/^FAILED (.*errors=\([0-9][0-9]*\).*/\1/p' "$log" | sum)
    p=$((p + ran - us - uf - ue)) f=$((f + uf + ue)) s=$((s + us))
  fi
  if grep -q '^fuzz_[a-z_0-9]*: \(ok\|FAILED\)' "$log"; then
    seen=1
    bad=$(sed -n 's/^\(fuzz_[a-z_0-9]*\): FAILED.*/\1/p' "$log" | sort -u)
    for t in $(sed -n 's/^\(fuzz_[a-z_0-9]*\): ok,.*/\1/p' "$log" | sort -u); do
      echo "$bad" | grep -qx "$t" || p=$((p + 1))
    done
    f=$((f + $(echo "$bad" | grep -c .)))
  fi
  if [ "$seen" -eq 0 ]; then
    case $status in
      0) p=1 ;;
      77) s=1 ;;
      *) f=1 ;;
    esac
  elif [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1
  fi
  echo "$p $f $s"
}

case ${1:-} in
  run)
    [ $# -ge 4 ] || { echo "usage: $0 run RESULTS NAME COMMAND..." >&2; exit 2; }
    results=$2 name=$3
    shift 3
    log=$(mktemp) || exit 2
    # the status comes out of the pipe through a file: sh has no pipefail
    { "$@"; echo $? > "$log.rc"; } 2>&1 | tee "$log"
    status=$(cat "$log.rc" 2>/dev/null || echo 1)
    mkdir -p "$(dirname "$results")"
    echo "$(count "$log" "$status") $name" >> "$results"
    rm -f "$log" "$log.rc"
    exit "$status" ;;
  skip)
    [ $# -eq 4 ] || { echo "usage: $0 skip RESULTS N NAME" >&2; exit 2; }
    mkdir -p "$(dirname "$2")"
    echo "0 0 $3 $4" >> "$2" ;;
  summary)
    [ $# -ge 2 ] || { echo "usage: $0 summary STATUS RESULTS..." >&2; exit 2; }
    status=$2
    shift 2
    files=
    for r in "$@"; do [ -f "$r" ] && files="$files $r"; done
    # shellcheck disable=SC2086
    set -- $(cat /dev/null $files | awk '{ p += $1; f += $2; s += $3 } END { print p + 0, f + 0, s + 0 }')
    failed=$2
    [ "$status" -ne 0 ] && [ "$failed" -eq 0 ] && failed=1
    echo "$1 passed, $failed failed, $3 skipped" ;;
  *)
    echo "usage: $0 run RESULTS NAME COMMAND... | skip RESULTS N NAME | summary STATUS RESULTS..." >&2
    exit 2 ;;
esac
