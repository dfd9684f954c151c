#!/usr/bin/env bash
# Refresh the vendored front-end files in static/vendor/ from the npm registry.
# The portal serves them itself, so it works offline; VERSIONS records what is there.
set -euo pipefail

HTMX_VERSION="${HTMX_VERSION:-2.0.11}"
PICO_VERSION="${PICO_VERSION:-2.1.1}"
CHARTJS_VERSION="${CHARTJS_VERSION:-4.6.1}"

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/static/vendor"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

fetch() {  # fetch PACKAGE VERSION -> unpacked into $work/PACKAGE
  local name="$1" version="$2" dir="$work/${1//\//_}"
  mkdir -p "$dir"
  (cd "$dir" && npm pack --silent "$name@$version" >/dev/null && tar -xzf ./*.tgz)
  echo "$dir/package"
}

htmx="$(fetch htmx.org "$HTMX_VERSION")"
pico="$(fetch @picocss/pico "$PICO_VERSION")"
chartjs="$(fetch chart.js "$CHARTJS_VERSION")"

mkdir -p "$dest/htmx" "$dest/pico" "$dest/chartjs"
cp "$htmx/dist/htmx.min.js" "$dest/htmx/htmx.min.js"
cp "$htmx/LICENSE" "$dest/htmx/LICENSE"
cp "$pico/css/pico.min.css" "$dest/pico/pico.min.css"
cp "$pico/LICENSE.md" "$dest/pico/LICENSE.md"
# Without its source map comment: the map is not vendored (collectstatic would look for it).
sed '/^\/\/# sourceMappingURL=/d' "$chartjs/dist/chart.umd.min.js" >"$dest/chartjs/chart.umd.min.js"
cp "$chartjs/LICENSE.md" "$dest/chartjs/LICENSE.md"

cat > "$dest/VERSIONS" <<VERSIONS
htmx.org $HTMX_VERSION (BSD Zero Clause) htmx/htmx.min.js
@picocss/pico $PICO_VERSION (MIT) pico/pico.min.css
chart.js $CHARTJS_VERSION (MIT) chartjs/chart.umd.min.js
VERSIONS
echo "static/vendor refreshed:"
cat "$dest/VERSIONS"
