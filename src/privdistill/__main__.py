from privdistill.cli import main

main()
