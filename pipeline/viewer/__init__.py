"""The live viewer (a web page over a WebSocket of wire messages); see ``server.py``."""
