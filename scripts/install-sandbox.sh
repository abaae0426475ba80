#!/usr/bin/env bash
# Installs bubblewrap (bwrap), which lmpo.envs.sandbox uses to isolate model-written code, and
# checks that it can create its namespaces here. It never fails its caller: where it cannot
# install or run bubblewrap it says what protection is missing and exits 0. See docs/sandbox.md.
set -u

say() { echo "install-sandbox: $*" >&2; }

# The namespaces lmpo.envs.sandbox asks for: root needs no user namespace, anyone else does.
works() {
  if [ "$(id -u)" = 0 ]; then
    flags=(--unshare-ipc --unshare-pid --unshare-net --unshare-uts --unshare-cgroup-try)
  else
    flags=(--unshare-all --unshare-user --disable-userns)
  fi
  bwrap "${flags[@]}" --die-with-parent --ro-bind / / --proc /proc -- /bin/true >/dev/null 2>&1
}

missing() {
  say "WARNING: $1"
  say "lmpo.envs.sandbox will fall back to a plain process, which still enforces the wall-clock"
  say "deadline, CPU/memory/file-size limits, a scrubbed environment and bounded output, but NOT:"
  say "  - network isolation (the code can open connections),"
  say "  - a private view of the filesystem (it can write /tmp, /var/tmp, /dev/shm; when the caller"
  say "    is not root, everything the caller can write, and the caller's environment via /proc),"
  say "  - a PID namespace (it sees every process; when the caller is not root, leftover processes are"
  say "    found only by an environment marker that a determined program can drop)."
  say "To get them: $2"
}

if command -v bwrap >/dev/null 2>&1; then
  if works; then
    say "bubblewrap works here ($(bwrap --version 2>/dev/null))"
  else
    missing "bwrap is installed but cannot create namespaces here (user namespaces disabled, or a container without CAP_SYS_ADMIN)" \
      "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1 / user.max_user_namespaces) or run the container with the needed privileges."
  fi
  exit 0
fi

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  say "installing bubblewrap with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y --no-install-recommends bubblewrap; then
    apt-get update && apt-get install -y --no-install-recommends bubblewrap
  fi
fi

if ! command -v bwrap >/dev/null 2>&1; then
  missing "bubblewrap is not installed and could not be installed here (not root, or no apt-get)" \
    "install the 'bubblewrap' package (sudo apt-get install bubblewrap, sudo dnf install bubblewrap, ...)."
elif works; then
  say "bubblewrap installed and works here ($(bwrap --version 2>/dev/null))"
else
  missing "bubblewrap was installed but cannot create namespaces here" \
    "allow unprivileged user namespaces or run the container with the needed privileges."
fi
exit 0
