#!/bin/sh
# Slow-link emulation for the distributed benchmark: two network namespaces joined
# by a veth pair rate-limited with tc tbf (this kernel has no netem: no added latency), one
# torchrun "node" (1 rank) in each: the multi-node torchrun path, over a link of RATE each way.
# Needs root (CAP_NET_ADMIN).
#   sh benchmarks/distributed/slowlink.sh RATE SYNC E   e.g.  sh benchmarks/distributed/slowlink.sh 50mbit local-echo 4
set -eu
RATE=$1 SYNC=$2 E=$3
cd "$(dirname "$0")/../.."
cleanup() { ip netns del de0 2>/dev/null || true; ip netns del de1 2>/dev/null || true; }
trap cleanup EXIT
cleanup
ip netns add de0; ip netns add de1
ip link add dve0 type veth peer name dve1
ip link set dve0 netns de0; ip link set dve1 netns de1
ip -n de0 addr add 10.77.0.1/24 dev dve0; ip -n de1 addr add 10.77.0.2/24 dev dve1
for n in 0 1; do
  ip -n de$n link set lo up; ip -n de$n link set dve$n up
  ip netns exec de$n tc qdisc add dev dve$n root tbf rate "$RATE" burst 32kbit latency 400ms
done
ARGS="-m dataecho.app.cli train --sync $SYNC --echo-factor $E --where batch --budget 12000 \
  --read-delay 0.0005 --eval-every 12000 --target-accuracy off --name $SYNC-e=$E"
for n in 1 0; do
  ip netns exec de$n env GLOO_SOCKET_IFNAME=dve$n OMP_NUM_THREADS=1 nice -n 15 \
    .venv/bin/torchrun --nnodes 2 --node-rank $n --nproc-per-node 1 \
    --master-addr 10.77.0.1 --master-port 29511 $ARGS > /tmp/slowlink-$n.log 2>&1 &
done
wait
grep -v '^[WI]1' /tmp/slowlink-0.log | tail -4
