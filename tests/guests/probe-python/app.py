"""A hostile tenant's Python handler: each entry's payload names an attack, and the handler
dead-letters with what happened, so the sandbox tests can check every one failed."""

import os
import socket
import time

from sluice_guest import RedisStream, dead_letter, http, subscriber


def attempt(what):
    try:
        return f"allowed: {what()}"
    except Exception as err:  # every denial is an exception of some kind
        return f"denied: {type(err).__name__}: {err}"


@subscriber(RedisStream("probe-python").group("g"))
def probe(payload: dict):
    attack = payload.get("attack")
    if attack == "hold":
        time.sleep(1)
        return dead_letter("held")
    if attack == "file":
        return dead_letter(attempt(lambda: open("/etc/hostname").read()))
    if attack == "env":
        return dead_letter(attempt(lambda: os.environ["HOME"]))
    if attack == "socket":
        return dead_letter(attempt(lambda: socket.create_connection(("127.0.0.1", payload["port"]))))
    if attack == "http":
        return dead_letter(attempt(lambda: http.get(payload["url"]).status))
    if attack == "alloc":
        blocks = []
        while True:
            blocks.append(bytearray(1 << 20))
    if attack == "loop":
        while True:
            pass
    return dead_letter(f"unknown attack {attack!r}")
