from mlbench.cli import main

main()
