#!/usr/bin/env bash
# The simulator at fleet scale (BENCHMARKS.md, "Simulator at fleet scale"):
# writes a scenario of WORKERS workers, each at 1 call/s of one tenant, over
# SERVERS servers of SLOTS slots and a shared cache, for 120 s with one crash
# and restart, and runs it once under /usr/bin/time (wall time, peak memory).
#
#   benches/fleet-scale.sh WORKERS [SERVERS] [SLOTS]
#   benches/fleet-scale.sh 500 10 128
set -euo pipefail
workers=${1:?workers}; servers=${2:-10}; slots=${3:-128}
dir=$(mktemp -d)
f="$dir/fleet-$workers.toml"
{
  echo "name = \"fleet-$workers\""
  echo "description = \"$workers workers at 1 call/s over $servers servers, one crash and restart\""
  echo "seed = 1"
  echo "duration_s = 120"
  echo "[hardening]"
  echo "rpm = 1000000"
  echo "failure_threshold = 5"
  echo "recovery_timeout_s = 20"
  echo "request_timeout_s = 15"
  echo "[cache]"
  echo 'kind = "shared"'
  list=""
  for i in $(seq 0 $((servers - 1))); do
    printf '[[servers]]\nname = "gpu-%s"\nslots = %s\n' "$i" "$slots"
    list="$list\"gpu-$i\", "
  done
  printf '[[workers]]\nname = "worker"\ncount = %s\nservers = [%s]\n' "$workers" "${list%, }"
  echo 'tenants = [{ id = 1, calls_per_min = 60 }]'
  printf '[[faults]]\nkind = "crash"\nat_s = 40\nserver = "gpu-0"\n'
  printf '[[faults]]\nkind = "restart"\nat_s = 70\nserver = "gpu-0"\n'
} > "$f"
cargo build --release -q -p redstring-sim
/usr/bin/time -f "%e s wall, %M KB peak" target/release/redstring-sim run "$f" --max-wall 3600 \
  | grep -E "real time|^calls:"
rm -r "$dir"
