"""KITTI 3D object evaluation (AP R11 / R40 for bbox, BEV, 3D, AOS) in pure NumPy."""
