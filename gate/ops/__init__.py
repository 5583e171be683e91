"""The operator's side: control (the one owner of config and operator state), the control
socket consoles attach to, the link (the console's side of it), the journal lock.

May know: every layer below except the tools. Never the service that builds it: what it
needs arrives as a port.
"""
