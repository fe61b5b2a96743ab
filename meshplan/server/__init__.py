"""The HTTP API and the web explorer (optional extra ``meshplan[web]``): see ``meshplan.server.app``."""
