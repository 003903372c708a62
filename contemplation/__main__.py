from contemplation.faces.cli.root import main

main()
