# Helpers of the bad-input suites (sourced; not run alone). The caller sets G (the gossamer binary)
# and `name` (for the scratch folder) first. Every case must end with the documented exit code and
# a message without internals: a stack trace, an "internal error" or a limit nobody typed.
tmp=$(mktemp -d -t "gossamer-$name-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cases=0
run() {  # run EXPECTED_CODE command...
  local want=$1; shift
  cases=$((cases + 1))
  timeout 60 "$@" >"$tmp/out" 2>&1
  local got=$?
  if [ "$got" -ne "$want" ]; then cat "$tmp/out"; fail "exit code $got, expected $want: $*"; fi
  for bad in "internal error" "e+308" "9223372036854775807" "terminate called" "frame #" ".tmp." "A subcommand is required" "Traceback"; do
    if grep -qF -- "$bad" "$tmp/out"; then cat "$tmp/out"; fail "output holds '$bad': $*"; fi
  done
}
says() { grep -qF -- "$1" "$tmp/out" || { cat "$tmp/out"; fail "output lacks '$1'"; }; }
