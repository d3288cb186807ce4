#!/bin/sh
# Starts PostgreSQL 15 as the official image does for the variables compose gives it: on the first
# start (an empty PGDATA) a cluster whose superuser is POSTGRES_USER with POSTGRES_PASSWORD, and the
# database POSTGRES_DB; then the server, listening on every address, password (SCRAM) logins from
# the network.
set -eu
bin=/usr/lib/postgresql/15/bin
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}" "${PGDATA:=/var/lib/postgresql/data}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is needed to initialise the cluster}"
    password_file="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" >"$password_file"
    "$bin/initdb" --pgdata "$PGDATA" --username "$POSTGRES_USER" --pwfile "$password_file" \
        --auth-local trust --auth-host scram-sha-256 --encoding UTF8 >/dev/null
    rm -f "$password_file"
    printf 'host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n' >>"$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != "postgres" ]; then
        "$bin/pg_ctl" --pgdata "$PGDATA" --options "-c listen_addresses=''" --wait start >/dev/null
        "$bin/createdb" --username "$POSTGRES_USER" --host /var/run/postgresql "$POSTGRES_DB"
        "$bin/pg_ctl" --pgdata "$PGDATA" --wait stop >/dev/null
    fi
fi
exec "$bin/postgres" -D "$PGDATA" -c listen_addresses='*'
