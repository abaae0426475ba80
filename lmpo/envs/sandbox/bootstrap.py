"""The first process inside the sandbox. It forks the program, which drops to the sandbox's uid,
applies the resource limits and execs; the waiter reports how the program ended on a pipe the
program never holds, so a program cannot forge its own status.

The parent runs this file's source with ``python -I -S -c``: standard library only, no lmpo.
"""

import ctypes
import json
import os
import resource
import shutil
import sys

_PR_SET_NO_NEW_PRIVS = 38


def _report(fd: int, **fields: object) -> None:
    os.write(fd, (json.dumps(fields) + "\n").encode())


def _copy_tree(source: str) -> None:
    """Copy into the working directory as the sandbox's uid, so the program owns its files."""
    for directory, subdirectories, names in os.walk(source):
        relative = os.path.relpath(directory, source)
        for name in subdirectories:
            os.makedirs(os.path.join(relative, name), exist_ok=True)
        for name in names:
            shutil.copyfile(os.path.join(directory, name), os.path.join(relative, name))


def _start_program(config: dict) -> None:
    status_fd = config["status_fd"]
    os.set_inheritable(status_fd, False)  # closed by the exec below
    uid, gid = config["uid"], config["gid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if os.getresuid() != (uid, uid, uid) or os.getgroups():
            raise PermissionError("could not drop to the sandbox uid")
    # setuid programs and file capabilities must not lift the program's privileges back up.
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if config["inputs"]:
        _copy_tree(config["inputs"])
    for name, (soft, hard) in config["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    argv = config["argv"]
    os.execv(argv[0], argv)


def main() -> None:
    config = json.loads(sys.argv[1])
    pid = os.fork()
    if pid == 0:
        try:
            _start_program(config)
        except BaseException as error:  # noqa: BLE001 - anything here means the program never ran
            _report(config["status_fd"], setup_error=f"{type(error).__name__}: {error}")
        os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    cpu_s = usage.ru_utime + usage.ru_stime
    if os.WIFSIGNALED(status):
        _report(config["status_fd"], signal=os.WTERMSIG(status), cpu_s=cpu_s)
    else:
        _report(config["status_fd"], exitcode=os.waitstatus_to_exitcode(status), cpu_s=cpu_s)


if __name__ == "__main__":
    main()
