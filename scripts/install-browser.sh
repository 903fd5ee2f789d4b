#!/usr/bin/env bash
# Headless Chromium for the HTML report's browser test (tests/test_report_html.py) and
# scripts/screenshots.py. Best effort and quiet: does nothing when a Chromium is already there,
# when not root, or without apt-get; the browser tests skip cleanly without one.
# DIAG_NO_BROWSER=1 skips it.
set -u
[ -n "${DIAG_NO_BROWSER:-}" ] && exit 0
for b in chromium chromium-browser google-chrome google-chrome-stable; do
  command -v "$b" >/dev/null 2>&1 && exit 0
done
if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup: no Chromium: the HTML report's browser test will be skipped (install the chromium package to run it)" >&2
  exit 0
fi
echo "setup: installing chromium (Debian package) for the HTML report's browser test" >&2
log="$(mktemp -t diag-apt.XXXXXX)"
export DEBIAN_FRONTEND=noninteractive
if apt-get install -y -qq --no-install-recommends chromium >"$log" 2>&1 \
   || { apt-get update -qq >>"$log" 2>&1 && apt-get install -y -qq --no-install-recommends chromium >>"$log" 2>&1; }; then
  rm -f "$log"
else
  echo "setup: could not install chromium (log: $log); the browser test will be skipped" >&2
fi
exit 0
