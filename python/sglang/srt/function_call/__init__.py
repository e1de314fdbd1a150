"""Tool calling: the per-model tool-call formats (detectors.py), a scanner that reads any of them as the text
streams in (base_format_detector.py), OpenAI `tool_calls` deltas (tool_call_stream.py), and the grammar that
enforces tool_choice "required" / a named function (grammar.py, tool_plan.py)."""
