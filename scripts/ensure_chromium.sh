#!/usr/bin/env bash
# Make sure Debian's Chromium is present for the browser tests.
#
# The browser tests drive /usr/bin/chromium through Python Playwright (the
# browser bundled with Playwright cannot be downloaded offline). When the
# binary is missing and we are root, install Debian's package quietly; when
# we cannot, say why and exit 0: the browser tests then skip with that reason,
# or fail when CI=true.
set -u

CHROMIUM=/usr/bin/chromium

if [ -x "$CHROMIUM" ]; then
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "ensure_chromium: $CHROMIUM is missing and we are not root; browser tests will be skipped" \
         "(install it with: sudo apt-get install chromium)"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure_chromium: $CHROMIUM is missing and apt-get is not available; browser tests will be skipped"
    exit 0
fi

echo "ensure_chromium: installing Debian's chromium for the browser tests (apt-get, a minute or two)..."
export DEBIAN_FRONTEND=noninteractive
if apt-get update -qq >/tmp/ensure_chromium.log 2>&1 \
   && apt-get install -y -qq chromium >>/tmp/ensure_chromium.log 2>&1; then
    echo "ensure_chromium: installed $("$CHROMIUM" --version 2>/dev/null || echo chromium)"
else
    echo "ensure_chromium: could not install chromium (see /tmp/ensure_chromium.log); browser tests will be skipped"
    tail -n 5 /tmp/ensure_chromium.log 2>/dev/null | sed 's/^/ensure_chromium:   /'
fi
exit 0
