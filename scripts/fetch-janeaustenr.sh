#!/usr/bin/env bash
# Unpack Debian's r-cran-janeaustenr data (Jane Austen's novels) into dataecho's cache, without
# installing R: `apt-get download` + `dpkg -x`. Nothing to do if R's package or the cache exists.
set -euo pipefail
py=${1:-.venv/bin/python}
fetch='from dataecho.app.sources.austen import ensure_janeaustenr_data as e; print(e())'
if ! "$py" -c "$fetch" 2>/tmp/dataecho-fetch.err; then
  # A fresh machine may have no package lists yet: refresh them once (root only), then retry.
  if [ "$(id -u)" -eq 0 ]; then apt-get update -qq; fi
  "$py" -c "$fetch" || { cat /tmp/dataecho-fetch.err >&2; exit 1; }
fi
