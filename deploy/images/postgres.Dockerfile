# syntax=docker/dockerfile:1
# PostgreSQL 15 from Debian, on the Debian base, for compose where no registry image can be pulled
# (deploy/compose.local.yaml). It takes the official image's variables (POSTGRES_USER, POSTGRES_PASSWORD,
# POSTGRES_DB, PGDATA): an empty data directory is initialised from them on the first start.
ARG BASE=localhost/billing-base:bookworm-updates
FROM ${BASE}
# Debian 12's current packages, security updates included: the release is the pin.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get upgrade --yes --no-install-recommends \
    && DEBIAN_FRONTEND=noninteractive apt-get install --yes --no-install-recommends postgresql-common \
    && sed -i 's/^#\?\s*create_main_cluster.*/create_main_cluster = false/' /etc/postgresql-common/createcluster.conf \
    && DEBIAN_FRONTEND=noninteractive apt-get install --yes --no-install-recommends postgresql-15 \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data \
    && install -d -o postgres -g postgres -m 2775 /var/run/postgresql
COPY --chmod=0755 deploy/images/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
ENV PGDATA=/var/lib/postgresql/data
# The Debian package's own user, whose id the package chooses.
# hadolint ignore=DL3066
USER postgres
EXPOSE 5432
STOPSIGNAL SIGINT
HEALTHCHECK --interval=2s --timeout=5s --retries=30 CMD ["pg_isready", "--host", "/var/run/postgresql"]
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint"]
