#!/bin/bash
# Starts a throwaway single-node Ceph (one monitor, one memstore OSD, radosgw) that serves S3 on
# loopback for the archive tests, and creates the test bucket. Idempotent: when something on
# 127.0.0.1:$PORT already accepts our credentials it is reused and only the bucket is ensured.
#
#   bash scripts/s3-up.sh            # then: cargo test --test archive
#   env: D (state dir, /tmp/pulpitum-rgw), PORT (7480), BUCKET (pulpitum-test),
#        STORE (memstore | bluestore: data in a 4 GiB sparse file instead of memory)
#   endpoint http://127.0.0.1:$PORT, access key AKTEST, secret SKTESTSECRET, region us-east-1,
#   path-style addressing.
# Stop it with scripts/s3-down.sh (same D). Ready in about 15 s; about 200 MB of memory.
# radosgw honours If-None-Match: * on single PUTs even under racing writers, but a multipart
# completion ignores it: objects that must be created conditionally are kept to one PUT.
set -euo pipefail
D=${D:-/tmp/pulpitum-rgw}; STORE=${STORE:-memstore}; PORT=${PORT:-7480}
BUCKET=${BUCKET:-pulpitum-test}
AK=AKTEST; SK=SKTESTSECRET; REGION=us-east-1
URL="http://127.0.0.1:$PORT"

signed() { # method path -> HTTP status of a SigV4-signed request (curl >= 7.75)
  # curl 7.x signs no x-amz-content-sha256 on its own and radosgw then rejects the signature;
  # the bodies here are empty, so send (and sign) the empty-payload hash ourselves.
  curl -s -o /dev/null -w '%{http_code}' -m 10 --aws-sigv4 "aws:amz:$REGION:s3" \
    -H "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" \
    --user "$AK:$SK" -X "$1" "$URL$2" || echo 000
}

ensure_bucket() {
  local code
  code=$(signed PUT "/$BUCKET")
  # 200: created; 409 BucketAlreadyOwnedByYou/Exists: already there (ours).
  case "$code" in
    200|409) echo "bucket $BUCKET ready on $URL" ;;
    *) echo "creating bucket $BUCKET failed: HTTP $code" >&2; exit 1 ;;
  esac
}

# Serialise concurrent callers (several test runs may start at once). The daemons must not
# inherit the lock descriptor (9>&- below), or they would hold the lock for their lifetime.
mkdir -p "$(dirname "$D")"
exec 9>"$D.lock"
flock 9

if [ "$(signed GET /)" = 200 ]; then
  echo "reusing the S3 server already answering on $URL"
  ensure_bucket
  exit 0
fi
if curl -s -o /dev/null -m 3 "$URL/"; then
  echo "something answers on $URL but rejects our credentials; refusing to start another" >&2
  exit 1
fi

if ! command -v radosgw >/dev/null || ! command -v ceph-mon >/dev/null || ! command -v ceph-osd >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    radosgw ceph-mon ceph-osd uuid-runtime >/dev/null
fi

# A previous run may have left daemons behind under the same D: stop them by their pids.
D="$D" bash "$(dirname "$0")/s3-down.sh"
rm -rf "$D"; mkdir -p "$D"/{run,log,mon.a,osd.0,rgw}
FSID=$(uuidgen)
cat > "$D/ceph.conf" <<CONF
[global]
fsid = $FSID
mon_host = v1:127.0.0.1:6789
public_addr = 127.0.0.1
ms_bind_ipv6 = false
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
# The OSD would place itself in the CRUSH map at start with a monitor command; on Ceph 16 that
# command can leave before the OSD has the monitor map, carry a zero fsid, be refused ('wrong
# fsid') and stop the OSD. We place it ourselves, before it starts, instead.
osd_crush_update_on_start = false
osd_class_update_on_start = false
run_dir = $D/run
admin_socket = $D/run/\$name.asok
log_file = $D/log/\$name.log
pid_file = $D/run/\$name.pid
mon_data = $D/mon.\$id
osd_data = $D/osd.\$id
osd_objectstore = $STORE
memstore_device_bytes = 2147483648
bluestore_block_path = $D/osd.\$id/block.file
bluestore_block_create = true
bluestore_block_size = 4294967296
osd_memory_target = 939524096
bluestore_cache_autotune = false
bluestore_cache_size = 268435456
osd_op_num_shards = 1
osd_op_num_threads_per_shard = 2
keyring = $D/keyring
[client.rgw.a]
rgw_frontends = beast endpoint=127.0.0.1:$PORT
rgw_data = $D/rgw
rgw_thread_pool_size = 32
CONF
C="-c $D/ceph.conf"
ceph-authtool --create-keyring "$D/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
monmaptool --create --fsid "$FSID" --addv a "[v1:127.0.0.1:6789]" "$D/monmap" >/dev/null
ceph-mon $C --mkfs -i a --monmap "$D/monmap" --keyring "$D/keyring"
ceph-mon $C -i a 9>&-
OSDUUID=$(uuidgen)
ID=$(ceph $C osd new "$OSDUUID")
ceph-osd $C -i "$ID" --mkfs --osd-uuid "$OSDUUID" >/dev/null 2>&1
ceph $C osd crush add "osd.$ID" 1.0 root=default >/dev/null 2>&1
ceph-osd $C -i "$ID" 9>&-
for _ in $(seq 1 60); do ceph $C osd stat 2>/dev/null | grep -q '1 up' && break; sleep 0.5; done
if ! ceph $C osd stat 2>/dev/null | grep -q '1 up'; then
  echo "s3-up.sh: the OSD did not come up; the end of $D/log/osd.$ID.log:" >&2
  tail -n 15 "$D/log/osd.$ID.log" >&2 || true
  exit 1
fi
radosgw $C -n client.rgw.a 9>&-
for _ in $(seq 1 120); do curl -s -o /dev/null "$URL/" && break; sleep 0.5; done
radosgw-admin $C user create --uid=test --display-name=test \
  --access-key="$AK" --secret-key="$SK" >/dev/null
# The user becomes visible to the gateway a moment after creation.
for _ in $(seq 1 40); do [ "$(signed GET /)" = 200 ] && break; sleep 0.5; done
ensure_bucket
echo "radosgw ready on $URL (pids: $(cat "$D"/run/*.pid | tr '\n' ' '))"
