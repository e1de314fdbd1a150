"""Client-side logit processors for the tests of --enable-custom-logit-processor, serialized the way a user's script
does it: the classes are defined in a script run as __main__ (so dill pickles them by value, code and all, as it
does for a client's own script) and printed with CustomLogitProcessor.to_str()."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import lru_cache
from typing import Dict

CLIENT_SCRIPT = r'''
import json
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor


class ForceTokenProcessor(CustomLogitProcessor):
    """Every row may only produce custom_params["token_id"]."""

    def __call__(self, logits, custom_param_list=None):
        for row, params in enumerate(custom_param_list):
            logits[row, :] = float("-inf")
            logits[row, params["token_id"]] = 0.0
        return logits


class RaisingProcessor(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list=None):
        raise RuntimeError("the client's processor raised on purpose")


print(json.dumps({"force": ForceTokenProcessor().to_str(), "raise": RaisingProcessor().to_str()}))
'''


@lru_cache(maxsize=1)
def client_processors() -> Dict[str, str]:
    """{"force": ..., "raise": ...}: processor strings as a client sends them in `custom_logit_processor`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run([sys.executable, "-c", CLIENT_SCRIPT], capture_output=True, text=True, timeout=120, env=env,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])
