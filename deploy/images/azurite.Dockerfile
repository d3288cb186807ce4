# syntax=docker/dockerfile:1
# Azurite from its npm package, on the Debian base, for compose where no registry image can be pulled
# (deploy/compose.local.yaml): Debian's Node.js and the node_modules `npm ci` installed from the
# repository's package-lock.json (the pinned azurite). Built by deploy/build-compose-images.sh, whose
# build context is the repository root with deploy/images/azurite.Dockerfile.dockerignore.
ARG BASE=localhost/billing-base:bookworm-updates
FROM ${BASE}
# Debian 12's current packages, security updates included: the release is the pin.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get upgrade --yes --no-install-recommends \
    && DEBIAN_FRONTEND=noninteractive apt-get install --yes --no-install-recommends nodejs \
    && apt-get clean \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 10002 azurite \
    && useradd --no-create-home --uid 10002 --gid azurite --home-dir /opt/azurite --shell /usr/sbin/nologin azurite
COPY package.json package-lock.json /opt/azurite/
COPY node_modules /opt/azurite/node_modules
WORKDIR /opt/azurite
ENV PATH=/opt/azurite/node_modules/.bin:$PATH
USER 10002:10002
EXPOSE 10000 10001
HEALTHCHECK --interval=5s --timeout=5s --retries=30 CMD ["node", "-e", "require('net').connect(10001, '127.0.0.1').on('connect', () => process.exit(0)).on('error', () => process.exit(1))"]
# As the registry image: `azurite` on the PATH, the command naming it (compose.yaml's does).
CMD ["azurite", "--blobHost", "0.0.0.0", "--queueHost", "0.0.0.0", "--inMemoryPersistence", "--skipApiVersionCheck", "--loose", "--disableTelemetry"]
