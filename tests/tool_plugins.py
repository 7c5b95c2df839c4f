"""Tools that misbehave, for the sandbox tests (imported by the sandbox's child process as
``tests.tool_plugins:<name>``)."""

import os
import time

from mindspeed_rl.tools import tool


@tool(
    description="Echo the text back.",
    parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)
def echo(text: str) -> str:
    return text


def raises() -> str:
    raise RuntimeError("the tool broke")


def hangs() -> str:
    time.sleep(600)
    return "never"


def spins() -> str:
    while True:
        pass


def huge() -> str:
    return "x" * (10 << 20)  # 10 MB


def prints_a_lot() -> str:
    print("y" * (4 << 20))
    return "small"


def eats_memory() -> str:
    blocks = [bytearray(64 << 20) for _ in range(64)]  # 4 GB
    return str(len(blocks))


def dies() -> str:
    os.abort()


def writes(path: str) -> str:
    with open(path, "w") as fh:
        fh.write("hello")
    return os.path.abspath(path)


def where() -> str:
    return os.getcwd()


def connects() -> str:
    import socket

    socket.socket().connect(("127.0.0.1", 9))
    return "connected"


def spawns() -> str:
    import subprocess

    return subprocess.run(["echo", "hi"], capture_output=True, text=True).stdout


def structured() -> dict:
    return {"value": 3, "unit": "apples"}


def answers_then_hangs() -> str:
    """Writes a complete answer itself, closes its output, then never exits."""
    import sys

    from mindspeed_rl.tools.tool_process import frame

    for fd in range(3, 16):
        try:
            os.write(fd, frame("early", "ok"))
            os.close(fd)
        except OSError:
            pass
    os.close(1), os.close(2), sys.stdout.close()
    time.sleep(600)
