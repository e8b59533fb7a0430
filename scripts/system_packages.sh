#!/usr/bin/env bash
# The Debian packages some tests need: installed when missing and apt-get can (root or password-less sudo);
# whatever is still missing afterwards is named with the tests that will skip without it. Never fails.
set -uo pipefail

missing_packages() {
  # chromium: the report tests render report.html headless; bubblewrap + libseccomp2: the code sandbox
  # (unimas/sandbox/) runs model-written code in namespaces with a seccomp filter built by libseccomp.
  command -v chromium >/dev/null 2>&1 || echo chromium
  command -v bwrap >/dev/null 2>&1 || echo bubblewrap
  ldconfig -p 2>/dev/null | grep -q libseccomp.so.2 || echo libseccomp2
}

missing=$(missing_packages | tr '\n' ' ')
if [ -n "$missing" ] && command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt_get=(apt-get)
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    apt_get=(sudo -n apt-get)
  else
    apt_get=()
  fi
  if [ ${#apt_get[@]} -gt 0 ]; then
    echo "installing ${missing}with apt-get"
    # shellcheck disable=SC2086  # one word per package
    { "${apt_get[@]}" update -qq && "${apt_get[@]}" install -y -qq $missing >/dev/null; } || echo "apt-get install ${missing}failed"
    # the linker cache that `ldconfig -p` reads may lag behind a fresh install (dpkg can defer its trigger)
    if [ "$(id -u)" = 0 ]; then ldconfig 2>/dev/null; else sudo -n ldconfig 2>/dev/null; fi
  fi
fi
for package in $(missing_packages); do
  case $package in
    chromium) echo "note: no chromium (apt-get install chromium): the report screenshot tests (tests/test_report*.py) will skip" ;;
    bubblewrap) echo "note: no bwrap (apt-get install bubblewrap): the sandbox tests (tests/test_sandbox.py, tests/test_code_team.py, tests/test_gateway_isolation.py) will skip" ;;
    libseccomp2) echo "note: no libseccomp.so.2 (apt-get install libseccomp2): the sandbox counts as unavailable, so tests/test_sandbox.py and tests/test_code_team.py will skip" ;;
  esac
done
exit 0
