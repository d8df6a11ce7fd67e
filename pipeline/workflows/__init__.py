"""One workflow per DVC stage, one module each, named as the stage (docs/DESIGN.md "Stages and workflows"):
the stage parses its arguments, builds its typed configs, calls its workflow and writes what it returns."""
