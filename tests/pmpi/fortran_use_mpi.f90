! The PMPI library under a Fortran program (`use mpi`): MPI_ALLREDUCE of double precision,
! integer and logical-free data, separate buffers and MPI_IN_PLACE, and MPI_BARRIER, checked
! against the sums computed here.  Prints "fortran use mpi ok" on rank 0.
program use_mpi
  use mpi
  implicit none
  integer :: ierr, rank, nranks, i, k
  double precision :: x(3), y(3)
  integer :: m(2), s(2)
  call MPI_INIT(ierr)
  call MPI_COMM_RANK(MPI_COMM_WORLD, rank, ierr)
  call MPI_COMM_SIZE(MPI_COMM_WORLD, nranks, ierr)
  do k = 1, 50
    call MPI_BARRIER(MPI_COMM_WORLD, ierr)
    x = (/ dble(rank + k), 1.0d0, -dble(rank) /)
    call MPI_ALLREDUCE(x, y, 3, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD, ierr)
    if (ierr /= MPI_SUCCESS .or. y(1) /= dble(nranks * (nranks - 1) / 2 + nranks * k) &
        .or. y(2) /= dble(nranks) .or. y(3) /= -dble(nranks * (nranks - 1) / 2)) then
      print *, 'rank', rank, 'wrong sum', y
      call MPI_ABORT(MPI_COMM_WORLD, 1, ierr)
    end if
    m = (/ rank + k, rank /)
    call MPI_ALLREDUCE(MPI_IN_PLACE, m, 2, MPI_INTEGER, MPI_MAX, MPI_COMM_WORLD, ierr)
    if (m(1) /= nranks - 1 + k .or. m(2) /= nranks - 1) then
      print *, 'rank', rank, 'wrong in-place max', m
      call MPI_ABORT(MPI_COMM_WORLD, 1, ierr)
    end if
  end do
  s = 0
  do i = 1, 2
    s(i) = i
  end do
  call MPI_ALLREDUCE(MPI_IN_PLACE, s, 2, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (s(2) /= 2 * nranks) call MPI_ABORT(MPI_COMM_WORLD, 1, ierr)
  if (rank == 0) print '(a)', 'fortran use mpi ok'
  call MPI_FINALIZE(ierr)
end program use_mpi
