#!/usr/bin/env bash
# The TCP path between two emulated hosts: for each link rate, iperf3's
# throughput between the hosts next to kvbench's (one server on host 1, one
# worker on host 2, 1 MB tensors pushed and pulled), both as a share of the
# link rate; kvbench with the default wire (CURVE: every frame encrypted) and
# with PSTRAIN_WIRE_SECURITY=auth (authenticated, frames in the clear).
# Needs root and iperf3 (PSTRAIN_BENCH_DEPS=1 scripts/install-deps.sh).
#
#   bench/cluster/tcp_links.sh [BUILD_DIR] [RATES]     e.g. build 1gbit,10gbit,25gbit
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${1:-build}
RATES=${2:-1gbit,10gbit,25gbit}
PSTRAIN=$(cd "$ROOT" && realpath "$BUILD/pstrain")
export PSTRAIN PSTRAIN_CLUSTER_NAME=pstlnk
CL="$HERE/cluster.sh"
command -v iperf3 >/dev/null || { echo "tcp_links.sh: iperf3 is missing: apt-get install iperf3" >&2; exit 1; }
[ -x "$PSTRAIN" ] || { echo "tcp_links.sh: $PSTRAIN is not built" >&2; exit 1; }

bash "$CL" down --name pstlnk >/dev/null 2>&1 || true
trap 'bash "$CL" down --name pstlnk >/dev/null 2>&1 || true' EXIT
bash "$CL" up 2 --name pstlnk --subnet 10.78.0 --rate "${RATES%%,*}" >/dev/null
LOGS=$(mktemp -d)

gbit() { # "10gbit" -> 10, "500mbit" -> 0.5
  local r=$1
  case "$r" in
    *gbit) echo "${r%gbit}" ;;
    *mbit) awk -v m="${r%mbit}" 'BEGIN { print m / 1000 }' ;;
    *) echo "tcp_links.sh: rate '$r': use gbit or mbit" >&2; exit 1 ;;
  esac
}

echo "| link | iperf3 Gbit/s | of link | iperf3 both ways, each | kvbench (CURVE) each way | of link | kvbench (auth) each way | of link | of iperf3 both ways | transport |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
# kvbench between the hosts: "<Gbit/s each way> <transport>". Push and pull
# each carry the payload, so each direction carries half of payload_gbps.
kv() {
  local out line
  out=$(bash "$CL" launch -n 1 -s 1 "$@" --log-dir "$LOGS/kv" --timeout 300 -- "$PSTRAIN" kvbench \
    --iters 200 --rounds 2 --mode pushpull --tensor-bytes 1048576 --tensors 16 --ceiling-iters 10 2>&1)
  line=$(grep -o 'kvbench: tensor_bytes=.*' <<<"$out" | head -1)
  [ -n "$line" ] || { echo "tcp_links.sh: kvbench failed:" >&2; echo "$out" | tail -20 >&2; exit 1; }
  awk -v g="$(sed -E 's/.*payload_gbps=([0-9.]+).*/\1/' <<<"$line")" 'BEGIN { printf "%.2f", g * 8 / 2 }'
  echo " $(sed -E 's/.*transport=(\S+).*/\1/' <<<"$line")"
}
IFS=, read -r -a rates <<<"$RATES"
for rate in "${rates[@]}"; do
  bash "$CL" shape --name pstlnk --rate "$rate" >/dev/null
  link=$(gbit "$rate")
  bash "$CL" exec 1 iperf3 -s -B 10.78.0.11 -1 -D --pidfile "$LOGS/iperf.pid"
  sleep 0.3
  one=$(bash "$CL" exec 2 iperf3 -c 10.78.0.11 -t 4 -O 1 -J |
    python3 -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9))')
  bash "$CL" exec 1 iperf3 -s -B 10.78.0.11 -1 -D --pidfile "$LOGS/iperf.pid"
  sleep 0.3
  both=$(bash "$CL" exec 2 iperf3 -c 10.78.0.11 -t 4 -O 1 --bidir -J |
    python3 -c 'import json,sys; e=json.load(sys.stdin)["end"]; print("%.2f" % (min(e["sum_received"]["bits_per_second"], e["sum_received_bidir_reverse"]["bits_per_second"]) / 1e9))')
  # Server 0 on host 1, worker 0 on host 2 (the ssh launcher's round robin).
  read -r curve transport <<<"$(kv)"
  read -r plain _ <<<"$(kv --env PSTRAIN_WIRE_SECURITY=auth)"
  awk -v r="$rate" -v l="$link" -v one="$one" -v both="$both" -v c="$curve" -v p="$plain" -v t="$transport" \
    'BEGIN { printf "| %s | %s | %.0f%% | %s | %s | %.0f%% | %s | %.0f%% | %.0f%% | %s |\n", r, one, 100 * one / l, both, c, 100 * c / l, p, 100 * p / l, 100 * p / both, t }'
done
rm -rf "$LOGS"
