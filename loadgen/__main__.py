from loadgen.cli.main import main

main()
