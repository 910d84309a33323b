from sandbox.cli import main

main(prog_name="sandbox")
