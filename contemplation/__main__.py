from contemplation.cli import main

main()
