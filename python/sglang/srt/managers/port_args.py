"""PortArgs: the ZMQ endpoints that connect the HTTP process and the scheduler process.

    main process (TokenizerManager)                      scheduler process
      PUSH  --connect-->  scheduler_input_ipc_name  <--bind--  PULL   requests and control messages
      PULL  --bind----->  tokenizer_ipc_name        <--connect-- PUSH  BatchReqOutput per step, RpcReply

Endpoints are ipc:// sockets in a fresh temporary directory, so several servers on one machine never collide;
`cleanup()` removes the directory at shutdown.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class PortArgs:
    ipc_dir: str
    scheduler_input_ipc_name: str
    tokenizer_ipc_name: str

    @classmethod
    def init_new(cls) -> "PortArgs":
        ipc_dir = tempfile.mkdtemp(prefix="sglang-ipc-")
        return cls(
            ipc_dir=ipc_dir,
            scheduler_input_ipc_name=f"ipc://{os.path.join(ipc_dir, 'scheduler_input')}",
            tokenizer_ipc_name=f"ipc://{os.path.join(ipc_dir, 'tokenizer')}",
        )

    def cleanup(self) -> None:
        shutil.rmtree(self.ipc_dir, ignore_errors=True)
