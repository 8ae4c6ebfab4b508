#!/usr/bin/env bash
# Copy Swagger UI's browser assets from the npm package swagger-ui-dist into the dashboard
# (app/servekit/dashboard/static/vendor/swagger-ui/), for the dashboard's API page (/api).
#
# Why vendored: the dashboard works without a network (no CDN; servers often have none), and a
# served file must be in the wheel. Why this package: swagger-ui-dist is Swagger UI's own
# prebuilt distribution (Apache-2.0), the files every Swagger UI page loads. Only the bundle,
# its stylesheet and the licence files are kept; source maps and the other bundles are not.
#
# Run it to move to another version (then run tests/test_dashboard_api.py): it needs npm and
# the npm registry; the committed copy needs neither. VERSION below is what is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${1:-5.35.0}"
dest="app/servekit/dashboard/static/vendor/swagger-ui"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "swagger-ui-dist@$VERSION" >/dev/null && tar xzf ./*.tgz)
rm -rf "$dest"
mkdir -p "$dest"
for file in swagger-ui-bundle.js swagger-ui.css LICENSE NOTICE swagger-ui-bundle.js.LICENSE.txt; do
  cp "$work/package/$file" "$dest/$file"
done
# The bundle's last line names its source map, which is not shipped: drop the reference so a
# browser's developer tools do not ask the server for it.
sed -i '/^\/\/# sourceMappingURL=/d' "$dest/swagger-ui-bundle.js"
sed -i 's#/\*\# sourceMappingURL=[^*]*\*/##' "$dest/swagger-ui.css"
echo "$VERSION" >"$dest/VERSION"
echo "swagger-ui-dist $VERSION -> $dest"
