#!/usr/bin/env bash
# Make the base image the Dockerfile starts from (python:3.11-slim) without a registry: Debian
# bookworm's Python 3.11 from the Debian mirror, imported into podman as
# localhost/python:3.11-slim, which `FROM python:3.11-slim` then resolves to with --pull=never.
# Needs: apt-get install mmdebstrap podman (run as root). See docs/ops.md, "Without a registry".
# Usage: make-base-image.sh [TAG [--force]]; without --force an existing TAG is kept.
set -euo pipefail
tag="${1:-localhost/python:3.11-slim}"
# Made once: a new base (a new image id) would make every build after it start from scratch.
if podman image exists "$tag" && [ "${2:-}" != --force ]; then
  echo "$tag exists (to make it again: $0 $tag --force)"
  exit 0
fi
mmdebstrap --quiet --variant=minbase \
  --include=python3,python3-pip,python3-venv,python-is-python3,ca-certificates \
  --customize-hook='rm -f "$1"/usr/lib/python3.*/EXTERNALLY-MANAGED' \
  --customize-hook='upload /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt' \
  --customize-hook='rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*' \
  bookworm - | podman import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$tag"
echo "made $tag"
