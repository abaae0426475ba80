"""Models named by a Hugging Face Hub id, on a machine that may have no network.

Without a connection, `from_pretrained` retries every file it asks the Hub about (five times,
waiting up to 8 s between tries): about 50 s per load even for a model already in the cache,
then, for one that is not, an error that does not say which name was wrong. So before the first
load of a Hub id lmpo asks once whether the Hub answers at all (a TCP connection to its
endpoint, a few seconds at most; not behind a proxy). When it does not, this process goes offline
(`HF_HUB_OFFLINE`, as a user would set it): a cached model loads from the cache at once, and a
name that is not there is refused straight away, saying what was looked for and where."""

from __future__ import annotations

import os
import socket
from functools import lru_cache
from urllib.parse import urlparse

import huggingface_hub
from huggingface_hub import constants

from lmpo.keyed import keyed
from lmpo.models.presets import PRESETS
from lmpo.names import closest, did_you_mean

PROBE_TIMEOUT_S = 3.0


PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


@lru_cache(maxsize=None)
def hub_unreachable(endpoint: str) -> str:
    """Why `endpoint` cannot be reached ("" when a TCP connection to it opens, or when requests
    go through a proxy, which a direct connection says nothing about)."""
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return ""
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=PROBE_TIMEOUT_S):
            return ""
    except OSError as error:
        return f"{url.hostname}:{port}: {error.strerror or error}"


went_offline = ""  # why lmpo took this process offline, if it did


def go_offline(reason: str) -> None:
    """Offline for the rest of this process and the processes it starts (reward workers, vLLM)."""
    global went_offline
    went_offline = reason
    constants.HF_HUB_OFFLINE = True
    os.environ["HF_HUB_OFFLINE"] = "1"


def is_cached(repo_id: str) -> bool:
    try:
        return isinstance(huggingface_hub.try_to_load_from_cache(repo_id, "config.json"), str)
    except ValueError:  # not a valid repo id
        return False


def check_hub_id(name: str) -> None:
    """For a model `name` that is neither a local directory nor a preset: go offline when the
    Hub cannot be reached, and refuse a name the cache does not hold while offline."""
    if not constants.is_offline_mode():
        reason = hub_unreachable(constants.ENDPOINT)
        if not reason:
            return
        go_offline(reason)
    if not is_cached(name):
        why = f"the Hub cannot be reached ({went_offline})" if went_offline else "HF_HUB_OFFLINE is set"
        raise keyed(FileNotFoundError(
            f"model {name!r}{did_you_mean(name, PRESETS)} is not a local directory or a preset ({', '.join(PRESETS)}), "
            f"and as a Hugging Face Hub id it is not in this machine's cache ({constants.HF_HUB_CACHE}) while {why}. "
            f"Check the name, or give a directory saved with save_pretrained"),
            "model.not_cached", name=name, near=closest(name, PRESETS),
            presets=", ".join(PRESETS), cache=constants.HF_HUB_CACHE, unreachable=went_offline)
