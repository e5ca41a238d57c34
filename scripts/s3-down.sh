#!/bin/bash
# Stops the cluster that scripts/s3-up.sh started under the same D, by the pids it recorded
# (never by process name, so other clusters on the machine are left alone).
D=${D:-/tmp/pulpitum-rgw}
for n in client.rgw.a osd.0 mon.a; do
  f=$D/run/$n.pid; [ -f "$f" ] || continue; p=$(cat "$f"); kill "$p" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
  kill -0 "$p" 2>/dev/null && kill -9 "$p"
  rm -f "$f"
done
true
