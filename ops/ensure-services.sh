#!/usr/bin/env bash
# Start the shared local services the test suite needs, if one has stopped.
# (CI machines start them before the run; this only covers a stopped one.)
set -u
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "starting redis-server on 127.0.0.1:6379"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  echo "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
fi
for _ in $(seq 1 50); do
  redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && pg_isready -q -h 127.0.0.1 -p 5432 && exit 0
  sleep 0.2
done
echo "services did not come up: redis $(redis-cli -h 127.0.0.1 ping 2>&1), postgres $(pg_isready -h 127.0.0.1 2>&1)" >&2
exit 1
