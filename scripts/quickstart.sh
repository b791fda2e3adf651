#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build, and run the main job
# on a local cluster. Until the training job lands, the main job is the
# parameter-server benchmark: 1 scheduler, 2 servers and 2 workers on this
# host check MXNet's dist_sync conformance, then print push/pull throughput
# next to a raw ZeroMQ ceiling measured in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
bash scripts/local_cluster.sh -s 2 -w 2 -- kvbench --verify
bash scripts/local_cluster.sh -s 2 -w 2 -- kvbench
