"""Starting, watching and stopping the processes of a server or an engine: one supervisor for all of them.

    process_group.py        ProcessGroup: spawn children, wait until ready, name the first cause of death, stop
    child.py                the child's side: `python -m sglang.srt.launch.child`, imports its entry by name
    tp_config.py            which TP ranks run on this node, checked before any starts
    tp_ranks.py             the follower ranks: for the Engine (rank 0 in-process), and for a follower node
    scheduler_processes.py  the server's scheduler side: one scheduler, TP rank 0 + followers, or DP replicas
Callers are srt/entrypoints/; this package imports srt/managers/ and names the entries of srt/managers/ and
srt/distributed/ only as strings (they run in the children), and neither of those imports it.
This file imports nothing: every child runs `python -m sglang.srt.launch.child` through it.
"""
