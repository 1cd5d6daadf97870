// The translation unit that builds the precompiled headers (cmake/Pch.cmake).
