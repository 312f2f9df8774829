"""``python -m byteps.server``: run the server or scheduler role of DMLC_ROLE."""

from byteps.server.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
