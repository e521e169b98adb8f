from tiny_models.make import main

main()
