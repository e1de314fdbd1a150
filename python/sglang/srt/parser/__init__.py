"""Readers of model output text: reasoning_parser.py (thoughts vs answer) and chat_output.py (one chat choice:
reasoning, content and tool calls)."""
