"""One module per `lenbatch <stage>` command, named after it; each exposes run(**kwargs)."""
