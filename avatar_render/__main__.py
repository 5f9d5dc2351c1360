from avatar_render.cli import main

main()
