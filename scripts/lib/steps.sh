# Sourced by scripts that run several steps (.ci/run, scripts/test): `step <name> <command...>`
# runs the command, prints its wall time, and at exit (success or failure) prints the table of
# every step and its time, so each run says where its minutes went.
# shellcheck shell=bash

_steps_rows=()
_steps_t0=$(date +%s)
_steps_title="${STEPS_TITLE:-$(basename "$0")}"
_steps_current=""

step() {
  local name="$1"
  shift
  local start
  start=$(date +%s)
  _steps_current="$name"
  echo "==> [$_steps_title] $name" >&2
  "$@"
  local took=$(($(date +%s) - start))
  _steps_rows+=("$(printf '%-34s %5d s  (%d:%02d)' "$name" "$took" $((took / 60)) $((took % 60)))")
  _steps_current=""
  echo "<== [$_steps_title] $name: ${took}s" >&2
}

_steps_report() {
  local code=$?
  local total=$(($(date +%s) - _steps_t0))
  {
    echo "---- $_steps_title: time per step"
    local row
    for row in "${_steps_rows[@]}"; do echo "  $row"; done
    [ -n "$_steps_current" ] && echo "  $(printf '%-34s %s' "$_steps_current" "FAILED (exit $code)")"
    printf '  %-34s %5d s  (%d:%02d)\n' "total" "$total" $((total / 60)) $((total % 60))
  } >&2
  return "$code"
}
trap _steps_report EXIT
