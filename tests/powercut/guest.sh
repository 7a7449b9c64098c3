#!/bin/bash
# Inside tests/rdma-vm/run's guest (root, the host's / read-only, the work directory shared):
# mounts the virtio disk (/dev/vda, ext4, made by tests/powercut/run on the host) and runs
# tesserad on it until the guest is killed. Arguments: the build directory, the sync policy,
# the log file (on the work share, so the host keeps it after the power cut); for a cluster node
# (tests/powercut/cluster) also its id, the map file and the certificates' directory: it then
# listens on 7070 (plain) and 7071 (mutual TLS, its node certificate).
set -u
build=$1 sync=$2 log=$3 node=${4:-} map=${5:-} certs=${6:-}
# A policy SYNC-inline: that policy, with small shards inline (storage.inline_max_kb = 64).
inline=0
[[ $sync == *-inline ]] && { sync=${sync%-inline}; inline=64; }
modprobe virtio_blk && modprobe ext4 || { echo "powercut guest: no virtio_blk or ext4" >&2; exit 3; }
for _ in $(seq 50); do [[ -b /dev/vda ]] && break; sleep 0.1; done
mkdir -p /mnt/pc && mount -t ext4 /dev/vda /mnt/pc || { echo "powercut guest: cannot mount /dev/vda" >&2; exit 4; }
if [[ -n $node ]]; then
  exec "$build/bin/tesserad" --node-id "$node" --listen 0.0.0.0:7070 --tls-listen 0.0.0.0:7071 \
    --tls-cert "$certs/node-$node.pem" --tls-key "$certs/node-$node.key" --tls-ca "$certs/ca.pem" \
    --map-file "$map" --data-dir /mnt/pc/data --sync "$sync" --log-level info >>"$log" 2>&1
fi
exec "$build/bin/tesserad" --listen 0.0.0.0:7070 --data-dir /mnt/pc/data --sync "$sync" \
  --storage-inline-max-kb "$inline" --anonymous-role admin --log-level info >>"$log" 2>&1
